"""A local browser viewer (viser) of Gaussians, their input cameras and camera path, with the
model's inference knobs live.

``python view.py PATH`` is the command line; this module is the library behind it:

- :func:`load_view_scene` reads a ``.ply`` or an ``infer.py`` output folder into a
  :class:`ViewScene` (Gaussians, input cameras with images, the rendered path's cameras);
- :class:`SplatViewer` serves it: the Gaussians as viser splats, the cameras as frustums with
  their images, the path as a spline, a panel with the knobs (a :class:`models.weights.knobs.KnobRunner`
  re-runs the model; without one only ``max_gaussians``, a prune of the loaded set), the Gaussian
  count, a button rendering the browser's camera with :func:`models.render` beside the browser's
  own picture, and "save" (the current set as a ``.ply``).

viser is imported here only, and ``import models`` does not import this module.
"""

from __future__ import annotations

import contextlib
import errno
import io
import ipaddress
import json
import math
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from datamodules.errors import InputError
from models.core.command_line import sigterm_raises
from models.core.gaussians import SH_C0, Gaussians
from models.core.output_folder import OutputFile, OutputFolderError, free_file_name
from models.geometry.rotations import matrix_to_quaternion, quaternion_to_matrix
from models.render.core import render
from models.splat_formats import is_splat_file
from models.weights.knobs import MAX_GAUSSIANS, Knob, KnobRunner

__all__ = [
    "ViewCamera",
    "ViewScene",
    "ViewerError",
    "SplatViewer",
    "gaussians_to_viser",
    "load_view_scene",
    "opencv_to_viser_pose",
    "viser_camera_to_opencv",
    "check_port",
]


class ViewerError(InputError):
    """Unusable input or settings; one line naming the file or setting."""


# --------------------------------------------------------------------------- conversions


def gaussians_to_viser(gaussians: Gaussians, index: int = 0) -> dict[str, np.ndarray]:
    """Scene ``index`` as viser's splat arrays (valid entries only).

    Returns:
        ``centers [N, 3]``, ``covariances [N, 3, 3]`` (``R diag(s^2) R^T``), ``rgbs [N, 3]`` (the
        SH degree-0 colour, ``SH_C0 * dc + 0.5`` clamped to [0, 1]) and ``opacities [N, 1]``, all
        float32.
    """
    g = gaussians[index].detach().to("cpu", torch.float64)
    valid = g.valid_mask()[0]
    scales = g.scales[0][valid].numpy()  # [N, 3]
    rotations = quaternion_to_matrix(g.rotations[0][valid]).numpy()  # [N, 3, 3]
    covariances = np.einsum("nij,nj,nkj->nik", rotations, scales**2, rotations)
    rgbs = np.clip(SH_C0 * g.harmonics[0][valid][:, :, 0].numpy() + 0.5, 0.0, 1.0)
    return {
        "centers": g.means[0][valid].numpy().astype(np.float32),
        "covariances": covariances.astype(np.float32),
        "rgbs": rgbs.astype(np.float32),
        "opacities": g.opacities[0][valid].numpy()[:, None].astype(np.float32),
    }


def viser_camera_to_opencv(
    wxyz: np.ndarray, position: np.ndarray, fov: float, aspect: float
) -> tuple[np.ndarray, np.ndarray]:
    """A viser camera (its frame is OpenCV's: +z forward, +y down) → this project's camera.

    Args:
        wxyz: camera-to-world rotation quaternion.
        position: camera centre in the world.
        fov: vertical field of view in radians.
        aspect: width / height.

    Returns:
        ``[4, 4]`` camera-to-world extrinsics and ``[3, 3]`` normalised intrinsics (principal
        point at the image centre).
    """
    extrinsics = np.eye(4)
    extrinsics[:3, :3] = quaternion_to_matrix(torch.as_tensor(np.asarray(wxyz, np.float64))).numpy()
    extrinsics[:3, 3] = np.asarray(position, dtype=np.float64)
    fy = 0.5 / math.tan(0.5 * fov)  # focal / height
    intrinsics = np.array([[fy / aspect, 0.0, 0.5], [0.0, fy, 0.5], [0.0, 0.0, 1.0]])
    return extrinsics, intrinsics


def opencv_to_viser_pose(extrinsics: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[4, 4]`` camera-to-world (OpenCV axes) → viser's ``(wxyz, position)``."""
    pose = np.asarray(extrinsics, dtype=np.float64)
    return matrix_to_quaternion(torch.from_numpy(pose[:3, :3])).numpy(), pose[:3, 3].copy()


# --------------------------------------------------------------------------- scenes


@dataclass
class ViewCamera:
    """An input camera: ``extrinsics [4, 4]`` camera-to-world, ``intrinsics [3, 3]`` normalised,
    ``size (H, W)`` in pixels, ``image [H, W, 3]`` uint8 or ``None``."""

    name: str
    extrinsics: np.ndarray
    intrinsics: np.ndarray
    size: tuple[int, int]
    image: np.ndarray | None = None

    @property
    def fov(self) -> float:
        """Vertical field of view in radians."""
        return 2.0 * math.atan(0.5 / float(self.intrinsics[1, 1]))

    @property
    def aspect(self) -> float:
        return self.size[1] / self.size[0]


@dataclass
class ViewScene:
    """What the viewer shows: ``gaussians`` (a batch of one), the input ``cameras``, the
    rendered camera path's camera-to-world poses ``path [P, 4, 4]`` (or ``None``)."""

    gaussians: Gaussians
    cameras: list[ViewCamera] = field(default_factory=list)
    path: np.ndarray | None = None
    title: str = "splatzoo"


def _read_ply(path: Path) -> Gaussians:
    try:
        gaussians = Gaussians.load(path)
    except ValueError as error:
        message = " ".join(str(error).split())
        if not message.startswith(str(path)):
            message = f"{path}: {message}"
        raise ViewerError(f"{message} (not a 3DGS .ply)") from error
    if gaussians.num_slots == 0:
        raise ViewerError(f"{path}: the PLY holds no Gaussians")
    finite = all(
        bool(torch.isfinite(t).all())
        for t in (gaussians.means, gaussians.scales, gaussians.rotations, gaussians.opacities)
    )
    if not finite:
        raise ViewerError(f"{path}: non-finite values in the Gaussians (not a 3DGS .ply)")
    return gaussians


def _read_image(path: Path) -> np.ndarray | None:
    from PIL import Image, ImageOps

    try:
        with Image.open(path) as image:
            return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    except (OSError, ValueError):
        return None


def _pixels_to_normalised(entry: dict[str, Any]) -> np.ndarray:
    w, h = float(entry["width"]), float(entry["height"])
    return np.array(
        [
            [float(entry["fx"]) / w, 0.0, float(entry["cx"]) / w],
            [0.0, float(entry["fy"]) / h, float(entry["cy"]) / h],
            [0.0, 0.0, 1.0],
        ]
    )


def _read_cameras(folder: Path) -> tuple[list[ViewCamera], np.ndarray | None]:
    """Input cameras (with the input images when found, else their renders) and the path."""
    path = folder / "cameras.json"
    if not path.is_file():
        return [], None
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
        input_root = None
        summary = folder / "summary.json"
        if summary.is_file():
            input_root = Path(json.loads(summary.read_text(encoding="utf-8")).get("input", ""))
        cameras = []
        for entry in table.get("frames", []):
            image = None
            if input_root is not None and entry.get("file"):
                source = input_root / entry["file"] if input_root.is_dir() else None
                if source is not None and source.is_file():
                    image = _read_image(source)
            if image is None and entry.get("render"):
                image = _read_image(folder / entry["render"])
            cameras.append(
                ViewCamera(
                    name=str(entry.get("file") or entry.get("render") or len(cameras)),
                    extrinsics=np.asarray(entry["camera_to_world"], dtype=np.float64),
                    intrinsics=_pixels_to_normalised(entry),
                    size=(int(entry["height"]), int(entry["width"])),
                    image=image,
                )
            )
        poses = [np.asarray(e["camera_to_world"], dtype=np.float64) for e in table.get("path", [])]
    except (ValueError, KeyError, TypeError) as error:
        raise ViewerError(f"{path}: not this project's cameras.json ({error})") from error
    return cameras, (np.stack(poses) if poses else None)


def load_view_scene(path: str | os.PathLike) -> ViewScene:
    """A ``.ply`` or an ``infer.py`` output folder (``gaussians.ply``, ``cameras.json``,
    ``renders/``) as a :class:`ViewScene`.

    Raises:
        ViewerError: one line naming the path (not found, not a 3DGS PLY, nothing to show).
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise ViewerError(f"{path}: not found")
    if path.is_file() or is_splat_file(path):
        if not is_splat_file(path):
            raise ViewerError(f"{path}: not a splat file (.ply, .spz, .sog, .glb, ...) or a folder")
        return ViewScene(_read_ply(path), title=path.name)
    ply = path / "gaussians.ply"
    if not ply.is_file():
        raise ViewerError(
            f"{path}: nothing to show (no gaussians.ply of an infer.py output; for a folder of "
            "photos pass model=NAME)"
        )
    cameras, poses = _read_cameras(path)
    return ViewScene(_read_ply(ply), cameras, poses, title=path.name)


# --------------------------------------------------------------------------- server helpers


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """Raise ``ViewerError`` when ``port`` (``> 0``) on ``host`` cannot be bound (viser would
    silently move to the next one)."""
    if not 0 <= port <= 65535:
        raise ViewerError(f"port={port}: must be in [0, 65535] (0: a free one)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))  # port 0: checks the host only
        except socket.gaierror as error:
            raise ViewerError(f"host={host}: unknown host ({error.strerror})") from error
        except OSError as error:
            if port and error.errno in (errno.EADDRINUSE, errno.EACCES):
                reason = "busy" if error.errno == errno.EADDRINUSE else "not allowed"
                raise ViewerError(
                    f"port={port}: {reason} on {host} (pass port=0 for a free one)"
                ) from error
            raise ViewerError(f"host={host}: cannot listen there ({error.strerror})") from error


def _thumbnail(image: np.ndarray, side: int = 160) -> np.ndarray:
    from PIL import Image

    h, w = image.shape[:2]
    scale = side / max(h, w)
    if scale >= 1:
        return image
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(image).resize(size, Image.BILINEAR))


# --------------------------------------------------------------------------- the viewer


class SplatViewer:
    """Serve a :class:`ViewScene` in the browser (viser).

    Args:
        scene: what to show.
        runner: re-runs the model when a knob moves; ``None``: only ``max_gaussians`` (a prune of
            ``scene.gaussians``).
        host: interface to bind (``127.0.0.1``; another one prints a warning).
        port: ``0``: a free port; else that port (busy: ``ViewerError``).
        save_path: where "save" writes the current set (``.ply``; never an input, never a file
            the viewer did not write itself: :class:`models.core.output_folder.OutputFile`).
        render_backend: backend of :func:`models.render` for the "render" button.
        render_side: longer side in pixels of that render.
        initial: knob values to start from (``None`` entries: the model's default).
        inputs: what the scene was read from (the save never replaces or writes into them).

    Raises:
        OutputFolderError: ``save_path`` may not be written (one line).
    """

    def __init__(
        self,
        scene: ViewScene,
        runner: KnobRunner | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        save_path: str | os.PathLike | None = None,
        render_backend: str = "auto",
        render_side: int = 256,
        initial: dict[str, Any] | None = None,
        inputs: tuple[str | os.PathLike, ...] = (),
    ) -> None:
        import viser

        check_port(host, port)
        if not is_loopback(host):
            print(
                f"warning: host={host} is not a loopback address: anyone who can reach this "
                "machine can open the viewer (and run the model)",
                file=sys.stderr,
            )
        self.scene = scene
        self.runner = runner
        self.inputs = tuple(inputs)
        if save_path is None:  # a free name in the current folder
            save_path = free_file_name("gaussians_view.ply")
        self._output = OutputFile(save_path, "view.py", self.inputs, suffix=".ply")
        self.save_path = self._output.path
        self.render_backend = render_backend
        self.render_side = int(render_side)
        self._lock = threading.RLock()
        self._gaussians = scene.gaussians
        self._base = scene.gaussians  # unpruned set of the current non-output knobs
        self.updates = 0  # scene updates sent (knob changes that changed the set)

        with contextlib.redirect_stdout(io.StringIO()):  # viser's banner (we print one line)
            self.server = viser.ViserServer(host=host, port=port, label=scene.title, verbose=False)
        if port and self.server.get_port() != port:  # lost a race for the port
            self.stop()
            raise ViewerError(f"port={port}: busy on {host} (pass port=0 for a free one)")
        self.host = host
        self.port = int(self.server.get_port())
        self.server.gui.configure_theme(control_layout="floating", show_share_button=False)
        self._frame_scene()
        self._add_cameras()
        self._build_gui(initial or {})
        self._refresh()

    # ------------------------------------------------------------------ properties
    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}/"

    @property
    def gaussians(self) -> Gaussians:
        """The set shown now."""
        return self._gaussians

    @property
    def count(self) -> int:
        return int(self._gaussians.count()[0])

    @property
    def knobs(self) -> dict[str, Knob]:
        if self.runner is not None:
            return dict(self.runner.knobs)
        return {MAX_GAUSSIANS.name: MAX_GAUSSIANS}

    # ------------------------------------------------------------------ scene
    def _scene_extent(self) -> tuple[np.ndarray, float]:
        """Robust centre (median) and radius (80th percentile distance) of the Gaussians."""
        g = self.scene.gaussians
        means = g.means[0][g.valid_mask()[0]].detach().double().cpu().numpy()
        if len(means) == 0:
            return np.zeros(3), 1.0
        centre = np.median(means, axis=0)
        radius = float(np.quantile(np.linalg.norm(means - centre, axis=1), 0.8))
        return centre, max(radius, 1e-3)

    def _frame_scene(self) -> None:
        """Open on the first input camera looking at the Gaussians in front of it, else on the
        Gaussians' centre from 2.5 radii along +z (the scene's OpenCV forward)."""
        centre, radius = self._scene_extent()
        self.radius = radius
        camera = self.initial_camera = {}
        if self.scene.cameras:
            first = self.scene.cameras[0]
            pose = first.extrinsics
            g = self.scene.gaussians
            means = g.means[0][g.valid_mask()[0]].detach().double().cpu().numpy()
            local = (means - pose[:3, 3]) @ pose[:3, :3]  # [N, 3] in the camera's frame
            ahead = local[:, 2][local[:, 2] > 0]
            depth = float(np.median(ahead)) if len(ahead) else 2.5 * radius
            # A little behind the first camera (its frustum and the path stay in view), looking
            # at the Gaussians' median depth in front of it.
            camera["position"] = pose[:3, 3] - 0.5 * depth * pose[:3, 2]
            camera["look_at"] = pose[:3, 3] + depth * pose[:3, 2]
            camera["up"] = -pose[:3, 1]
            camera["fov"] = first.fov
        else:
            camera["position"] = centre - 2.5 * radius * np.array([0.0, 0.0, 1.0])
            camera["look_at"] = centre
            camera["up"] = np.array([0.0, -1.0, 0.0])
            camera["fov"] = math.radians(50.0)
        self.server.scene.set_up_direction(tuple(camera["up"]))
        initial = self.server.initial_camera
        initial.position = tuple(camera["position"])
        initial.look_at = tuple(camera["look_at"])
        initial.up = tuple(camera["up"])
        initial.fov = float(camera["fov"])
        depth = float(np.linalg.norm(camera["look_at"] - camera["position"]))
        initial.near = max(1e-4, 0.01 * depth)
        initial.far = max(100.0, 100 * depth)

    def _add_cameras(self) -> None:
        size = 0.1 * self.radius
        self._overlays = []
        for i, camera in enumerate(self.scene.cameras):
            wxyz, position = opencv_to_viser_pose(camera.extrinsics)
            frustum = self.server.scene.add_camera_frustum(
                f"/cameras/{i:02d}",
                fov=camera.fov,
                aspect=camera.aspect,
                scale=size,
                image=None if camera.image is None else _thumbnail(camera.image),
                wxyz=wxyz,
                position=position,
                color=(230, 120, 20),
            )
            self._overlays.append(frustum)
        if self.scene.path is not None and len(self.scene.path) >= 2:
            centres = self.scene.path[:, :3, 3].astype(np.float32)  # [P, 3]
            spline = self.server.scene.add_spline_catmull_rom(
                "/path",
                points=centres,
                color=(40, 110, 230),
                thickness=3.0,
                thickness_units="screen",
            )
            self._overlays.append(spline)

    def set_splats_visible(self, visible: bool) -> None:
        """Show or hide the Gaussians (the rest of the scene stays)."""
        self._splats.visible = bool(visible)

    def set_cameras_visible(self, visible: bool) -> None:
        """Show or hide the input cameras' frustums and the camera path."""
        for handle in self._overlays:
            handle.visible = bool(visible)

    # ------------------------------------------------------------------ GUI
    def _build_gui(self, initial: dict[str, Any]) -> None:
        gui = self.server.gui
        self._count_text = gui.add_markdown("**Gaussians:** -")
        reuse = ", ".join(self.runner.reused) if self.runner is not None else ""
        self._status = gui.add_markdown(
            f"1 forward(s), reusing: {reuse or 'nothing'}" if self.runner is not None else ""
        )
        self._controls: dict[str, Any] = {}  # knob name → (enable checkbox | None, slider)
        model = self.runner.model if self.runner is not None else None
        defaults = self.runner.defaults() if self.runner is not None else {}
        with gui.add_folder("Inference knobs"):
            for name, knob in self.knobs.items():
                low, high = knob.bounds(model)
                value = initial.get(name, defaults.get(name))
                if name == MAX_GAUSSIANS.name:  # the slider's top is "keep all"
                    full = int(self._base.count()[0])
                    high = max(full, 1)
                    enabled = True
                    value = full if value is None else min(int(value), full)
                else:
                    enabled = value is not None or knob.default_attr is not None
                    if value is None:  # off by default (e.g. no budget): start the slider high
                        value = high if high is not None else low
                if high is None:
                    high = max(float(value) * 4, float(low) + 16 * knob.step)
                if knob.low_open:
                    low = knob.step
                toggle = None
                if knob.default_attr is None and name != MAX_GAUSSIANS.name:  # "off" state
                    toggle = gui.add_checkbox(f"{name} on", enabled, hint=knob.help)
                cast = int if knob.kind == "int" else float
                slider = gui.add_slider(
                    name,
                    min=cast(low),
                    max=cast(high),
                    step=cast(knob.step),
                    initial_value=cast(value),
                    hint=knob.help,
                )
                self._controls[name] = (toggle, slider)
                slider.on_update(lambda _: self._refresh())
                if toggle is not None:
                    toggle.on_update(lambda _: self._refresh())
        with gui.add_folder("Render"):
            render_button = gui.add_button("Render this view with splatzoo", icon=None)
            self._browser_image = gui.add_image(
                np.full((8, 8, 3), 255, np.uint8), label="browser (viser)", visible=False
            )
            self._render_image = gui.add_image(
                np.full((8, 8, 3), 255, np.uint8), label="splatzoo (models.render)", visible=False
            )
            save_button = gui.add_button("Save .ply")
        render_button.on_click(lambda event: self._on_render(event.client))
        save_button.on_click(lambda event: self._on_save(event.client))

    def knob_values(self) -> dict[str, float | int | None]:
        """The knob values the panel shows (``None``: off)."""
        values = {}
        for name, (toggle, slider) in self._controls.items():
            values[name] = None if toggle is not None and not toggle.value else slider.value
            if name == MAX_GAUSSIANS.name and slider.value >= slider.max:
                values[name] = None  # at the top: keep all
        return values

    def set_knob(self, name: str, value: float | int | None) -> int:
        """Set a knob as the panel would (``None``: off) and wait for the scene update; returns
        the Gaussian count."""
        if name not in self._controls:
            raise ValueError(f"{name}: not a knob here (knobs: {', '.join(self._controls)})")
        toggle, slider = self._controls[name]
        with self._lock:
            if value is None and name == MAX_GAUSSIANS.name:
                slider.value = slider.max
            elif value is None:
                if toggle is None:
                    raise ValueError(f"{name}: has no off state")
                toggle.value = False
            else:  # the value first: switching on then runs once, with it
                slider.value = int(value) if isinstance(slider.value, int) else float(value)
                if toggle is not None:
                    toggle.value = True
            self._refresh()
        return self.count

    def _refresh(self) -> None:
        """Re-run (or re-prune) for the panel's values and update splats and count."""
        with self._lock:
            if getattr(self, "_refreshing", False):  # a control moved by this refresh
                return
            self._refreshing = True
            try:
                self._refresh_locked()
            finally:
                self._refreshing = False

    def _refresh_locked(self) -> None:
        """``_refresh`` under the lock."""
        values = self.knob_values()
        forwards = self.runner.forwards if self.runner is not None else 0
        try:
            start = time.perf_counter()
            if self.runner is not None:
                base = self.runner.run(**{**values, MAX_GAUSSIANS.name: None})
            else:
                base = self.scene.gaussians
            limit = values.get(MAX_GAUSSIANS.name)
            gaussians = base if limit is None else base.prune(max_count=int(limit))
            seconds = time.perf_counter() - start
        except ValueError as error:
            self._status.content = f"error: {' '.join(str(error).split())}"
            return
        self._base = base
        full = int(base.count()[0])
        if MAX_GAUSSIANS.name in self._controls:  # its range follows the unpruned count
            slider = self._controls[MAX_GAUSSIANS.name][1]
            if slider.max != max(full, 1):
                keep_all = limit is None
                slider.max = max(full, 1)
                slider.value = slider.max if keep_all else min(int(limit), slider.max)
        changed = not hasattr(self, "_splats") or gaussians is not self._gaussians
        self._gaussians = gaussians
        if changed:
            self._splats = self.server.scene.add_gaussian_splats(
                "/gaussians", **gaussians_to_viser(gaussians)
            )
            self.updates += 1
        self._count_text.content = f"**Gaussians:** {self.count:,}"
        if self.runner is not None and self.runner.forwards > forwards:
            reuse = ", ".join(self.runner.reused) or "nothing"
            self._status.content = (
                f"{self.runner.forwards} forward(s), reusing: {reuse}; last one "
                f"{seconds * 1000:.0f} ms"
            )

    # ------------------------------------------------------------------ render / save
    def render_camera(
        self, extrinsics: np.ndarray, intrinsics: np.ndarray, shape: tuple[int, int]
    ) -> np.ndarray:
        """The current set rendered by :func:`models.render` (white background, as viser's) →
        ``[H, W, 3]`` uint8."""
        g = self._gaussians
        e = torch.as_tensor(extrinsics, dtype=g.dtype, device=g.device)[None, None]
        k = torch.as_tensor(intrinsics, dtype=g.dtype, device=g.device)[None, None]
        background = torch.ones(3, dtype=g.dtype, device=g.device)
        with torch.inference_mode():
            color = render(g, e, k, shape, background=background, backend=self.render_backend)
        image = color.color[0, 0].clamp(0, 1).permute(1, 2, 0).float().cpu().numpy()
        return (image * 255 + 0.5).astype(np.uint8)

    def client_camera(self, client) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        """A browser's camera as ``(extrinsics [4, 4], intrinsics [3, 3], (H, W))``, the longer
        side ``render_side`` pixels."""
        camera = client.camera
        height = max(1, int(getattr(camera, "image_height", 0) or 480))
        width = max(1, int(getattr(camera, "image_width", 0) or 640))
        aspect = width / height
        scale = self.render_side / max(height, width)
        shape = (max(8, round(height * scale)), max(8, round(width * scale)))
        extrinsics, intrinsics = viser_camera_to_opencv(
            camera.wxyz, camera.position, camera.fov, aspect
        )
        return extrinsics, intrinsics, shape

    def render_client(self, client) -> tuple[np.ndarray, np.ndarray | None]:
        """``(splatzoo render, the browser's own render or None)`` of a browser's camera."""
        extrinsics, intrinsics, shape = self.client_camera(client)
        ours = self.render_camera(extrinsics, intrinsics, shape)
        overlays = [h for h in self._overlays if h.visible]
        for handle in overlays:  # the browser's picture of the splats alone
            handle.visible = False
        try:
            browser = client.get_render(shape[0], shape[1], timeout=10.0)[..., :3]
        except Exception:  # the browser may not answer (closed tab, no WebGL)
            browser = None
        finally:
            for handle in overlays:
                handle.visible = True
        return ours, browser

    def _on_render(self, client) -> None:
        if client is None:
            return
        ours, browser = self.render_client(client)
        self._render_image.image = ours
        self._render_image.visible = True
        if browser is not None:
            self._browser_image.image = browser
            self._browser_image.visible = True
            difference = np.abs(ours.astype(np.float32) - browser.astype(np.float32)).mean()
            self._status.content = f"render: {ours.shape[1]}x{ours.shape[0]} px, mean |splatzoo - browser| = {difference:.1f}/255"

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write the current set as an INRIA-layout ``.ply`` (atomically); returns the path.

        Raises:
            OutputFolderError: the file is an input or one the viewer did not write (one line).
        """
        output = self._output
        if path is not None and Path(path).expanduser().resolve() != output.path:
            output = OutputFile(path, "view.py", self.inputs, suffix=".ply")
        gaussians = self._gaussians
        return output.write(gaussians.save_ply)

    def _on_save(self, client) -> None:
        try:
            target = self.save(None)
        except OutputFolderError as error:
            message = f"not saved: {' '.join(str(error).split())}"
            print(f"error: {message}", file=sys.stderr, flush=True)
            self._status.content = message
            if client is not None:
                client.add_notification("Not saved", message, auto_close_seconds=8.0)
            return
        message = f"saved {self.count:,} Gaussians to {target}"
        print(message)
        self._status.content = message
        if client is not None:
            client.add_notification("Saved", message, auto_close_seconds=5.0)

    # ------------------------------------------------------------------ lifetime
    def stop(self) -> None:
        with contextlib.redirect_stdout(io.StringIO()):  # viser's "Server stopped"
            self.server.stop()

    def serve_forever(self) -> None:
        """Block until Ctrl-C (or SIGTERM), then stop the server."""
        try:
            with sigterm_raises():
                while True:
                    time.sleep(0.5)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (Terminated)
            pass
        finally:
            self.stop()
