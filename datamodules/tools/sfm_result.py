"""A structure-from-motion result: the COLMAP model it wrote and what is read from it.

``SfmResult`` (``datamodules.tools.sfm.estimate_poses``' return) reads poses back, expresses them
in the scene frame, writes ``cameras.json``, exports the model (optionally in the scene frame) and
undistorts the images; ``write_entry``/``read_entry`` keep it in a cache entry.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from datamodules.readers import colmap, colmap_records
from datamodules.readers.undistort import undistort_image
from models.core.pixels import image_from_uint8, image_to_uint8
from models.geometry.cameras import intrinsics_to_normalized, normalize_scene

__all__ = ["SfmResult", "import_pycolmap", "read_entry", "write_entry"]


def import_pycolmap():
    """``import pycolmap`` keeping Python's SIGTERM handling: pycolmap installs glog's failure
    handler for SIGTERM on import (a C++ stack dump, sometimes a hang), which is put back here."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    import pycolmap

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
    return pycolmap


@dataclass
class SfmResult:
    """A finished reconstruction.

    Attributes:
        model_dir: folder with ``cameras.txt``, ``images.txt``, ``points3D.txt`` (COLMAP's world
            frame).
        image_dir: the folder the image names are relative to.
        registered: names of the posed images, in natural name order.
        missing: names of the images that did not register.
        num_points3d: triangulated points.
        mean_reprojection_error: mean over all observations, pixels.
        camera_model: COLMAP model of the cameras.
        focal_px: focal length(s) of the camera(s) in pixels (``fx`` of each camera).
        matching: the matching actually run.
        timings_s: seconds per stage (``features``, ``matching``, ``mapping``, ``total``) of the
            run that made the model (a cached result keeps the original timings).
        cached: the model came from the cache.
        key: the cache key.
    """

    model_dir: Path
    image_dir: Path
    registered: list[str]
    missing: list[str]
    num_points3d: int
    mean_reprojection_error: float
    camera_model: str
    focal_px: list[float]
    matching: str
    timings_s: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    key: str = ""

    # ------------------------------------------------------------------ cameras

    def poses(self) -> dict[str, dict]:
        """Per registered image: ``camera_to_world [4, 4]`` float64 (COLMAP's world frame), pinhole
        ``fx, fy, cx, cy`` in pixels, ``width``, ``height`` and ``distortion`` (OpenCV
        ``[k1, k2, p1, p2, k3, k4, k5, k6]``, zeros for pinhole cameras); the layout of
        ``cameras_json.read_cameras_json``."""
        memo = self.__dict__.get("_poses")
        if memo is not None and memo[0] == self.model_dir:
            return dict(memo[1])
        cameras, images, _ = colmap.read_model(self.model_dir, points=False)
        out: dict[str, dict] = {}
        for image in images.values():
            camera = cameras[image.camera_id]
            distortion = colmap.camera_distortion(camera)
            out[image.name] = {**colmap.image_pose(image, camera), "distortion": distortion}
        poses = {name: out[name] for name in self.registered}
        self.__dict__["_poses"] = (self.model_dir, poses)
        return dict(poses)

    @property
    def distorted(self) -> bool:
        """The cameras have non-zero lens distortion (images must be undistorted to use them)."""
        return any(np.abs(p["distortion"]).max() > 0 for p in self.poses().values())

    def scene_frame(self, names: Sequence[str] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Cameras of ``names`` (default: all registered) in the scene frame.

        Returns:
            ``extrinsics [V, 4, 4]`` camera-to-world (first view the identity, largest camera
            distance 1), ``intrinsics [V, 3, 3]`` normalised by each image's size and the
            ``scale`` that COLMAP's world distances were divided by.
        """
        poses = self.poses()
        names = list(names) if names is not None else self.registered
        unknown = [n for n in names if n not in poses]
        if unknown:
            raise KeyError(f"not registered: {', '.join(unknown[:5])}")
        c2w = torch.stack([poses[n]["camera_to_world"] for n in names])  # [V, 4, 4]
        extrinsics, _, scale = normalize_scene(c2w)
        intrinsics = torch.stack(
            [
                intrinsics_to_normalized(
                    torch.tensor(
                        [[p["fx"], 0.0, p["cx"]], [0.0, p["fy"], p["cy"]], [0.0, 0.0, 1.0]],
                        dtype=torch.float64,
                    ),
                    (p["height"], p["width"]),
                )
                for p in (poses[n] for n in names)
            ]
        )
        return extrinsics, intrinsics, scale

    def write_cameras_json(self, path: str | Path, image_dir: str | Path | None = None) -> Path:
        """Write the registered cameras as ``cameras.json`` (COLMAP's world frame, pinhole
        intrinsics in pixels); ``image_dir`` (default ``self.image_dir``) is recorded for
        reference only."""
        frames = []
        for name, pose in self.poses().items():
            frames.append(
                {
                    "file": name,
                    "camera_to_world": pose["camera_to_world"].tolist(),
                    **{k: pose[k] for k in ("fx", "fy", "cx", "cy", "width", "height")},
                }
            )
        path = Path(path)
        data = {
            "frames": frames,
            "poses": "structure-from-motion (pycolmap), COLMAP world frame",
            "images": str(image_dir or self.image_dir),
        }
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")
        return path

    def export(
        self, dest: str | Path, names: Sequence[str] | None = None, scene_frame: bool = True
    ) -> Path:
        """Write the model as COLMAP text to ``dest`` (created), moved into the scene frame of
        ``names`` (default: all registered; the frame ``scene_frame(names)`` uses), so that its
        cameras and points agree with Gaussians predicted from those views; ``scene_frame=False``
        keeps COLMAP's own world frame (the capture's frame, where ``infer.py`` writes).
        """
        pycolmap = import_pycolmap()

        if not scene_frame:
            dest = Path(dest)
            dest.mkdir(parents=True, exist_ok=True)
            pycolmap.Reconstruction(str(self.model_dir)).write_text(str(dest))
            return dest

        poses = self.poses()
        names = list(names) if names is not None else self.registered
        c2w = torch.stack([poses[n]["camera_to_world"] for n in names])  # [V, 4, 4]
        _, _, scale = normalize_scene(c2w)
        w2c = torch.linalg.inv(c2w[0]).numpy()  # [4, 4]
        s = 1.0 / float(scale)
        rotation = pycolmap.Rotation3d(w2c[:3, :3])
        transform = pycolmap.Sim3d(s, rotation, (w2c[:3, 3] * s).reshape(3, 1))
        reconstruction = pycolmap.Reconstruction(str(self.model_dir))
        reconstruction.transform(transform)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        reconstruction.write_text(str(dest))
        return dest

    def undistort(self, dest: str | Path) -> Path:
        """Write the registered images, resampled into the pinhole part of their cameras, to
        ``dest`` (PNG, same names with ``.png``); a distortion-free camera's image is copied.

        Returns:
            ``dest``.
        """
        from PIL import Image

        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for name, pose in self.poses().items():
            source = self.image_dir / name
            if np.abs(pose["distortion"]).max() == 0:
                shutil.copy2(source, dest / name)
                continue
            with Image.open(source) as image:
                array = image_from_uint8(image.convert("RGB"))
            k = torch.tensor(
                [
                    [pose["fx"] / pose["width"], 0.0, pose["cx"] / pose["width"]],
                    [0.0, pose["fy"] / pose["height"], pose["cy"] / pose["height"]],
                    [0.0, 0.0, 1.0],
                ],
                dtype=torch.float64,
            )
            out = undistort_image(array, k, pose["distortion"])
            Image.fromarray(image_to_uint8(out)).save(dest / name)
        return dest

    def summary(self) -> dict:
        """A JSON-ready summary (for ``summary.json`` and reports)."""
        return {
            "registered": len(self.registered),
            "images": len(self.registered) + len(self.missing),
            "missing": list(self.missing),
            "mean_reprojection_error_px": round(self.mean_reprojection_error, 4),
            "points3d": self.num_points3d,
            "camera_model": self.camera_model,
            "focal_px": [round(f, 2) for f in self.focal_px],
            "matching": self.matching,
            "cached": self.cached,
            "timings_s": dict(self.timings_s),
        }


def write_entry(entry: Path, result: SfmResult) -> None:
    data = asdict(result)
    data["model_dir"] = "sparse"
    data["image_dir"] = str(result.image_dir)
    data.pop("cached")
    (entry / "result.json").write_text(json.dumps(data, indent=2), encoding="utf-8")


def read_entry(entry: Path, image_dir: Path) -> SfmResult | None:
    try:
        data = json.loads((entry / "result.json").read_text(encoding="utf-8"))
        data["model_dir"] = entry / "sparse"
        data["image_dir"] = image_dir
        result = SfmResult(**data, cached=True)
        _, images, _ = colmap.read_model(result.model_dir, points=False)  # a corrupt entry: redo
    except (OSError, ValueError, TypeError, colmap_records.ColmapError):
        return None
    if not set(result.registered) <= {image.name for image in images.values()}:
        return None
    return result
