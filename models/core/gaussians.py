"""The ``Gaussians`` container shared by every model, the renderer and the PLY writer."""

from __future__ import annotations

import math
import os
import tempfile
import warnings
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from datamodules.errors import InputError
from models.core.sh import sh_degree_of, sh_rotation
from models.geometry.rotations import matrix_to_quaternion, quaternion_multiply
from models.geometry.similarity import Similarity
from models.splat_formats import SplatArrays, format_of, read_splats, write_splats
from models.splat_formats.compressed_ply import is_compressed_ply

__all__ = ["Gaussians", "SH_C0", "rgb_to_sh", "sh_to_rgb", "transform_gaussians"]


def _all_finite(value: Tensor) -> bool:
    """Whether every entry is finite. A NaN or an infinity makes the sum non-finite, so one sum
    (a fifth of ``isfinite(value).all()``'s time on a CPU, where a fit checks its set every step)
    settles the common case; only a sum that overflows looks again, entry by entry."""
    with torch.no_grad():
        return bool(torch.isfinite(value.sum())) or bool(torch.isfinite(value).all())


SH_C0 = 0.28209479177387814  # Y_0^0, the DC spherical harmonic


def rgb_to_sh(rgb: Tensor) -> Tensor:
    """DC coefficient that renders as ``rgb`` (gsplat's ``colour = SH + 0.5`` convention)."""
    return (rgb - 0.5) / SH_C0


def sh_to_rgb(dc: Tensor) -> Tensor:
    """Colour of a DC coefficient."""
    return dc * SH_C0 + 0.5


@dataclass
class Gaussians:
    """A batch of 3D Gaussian sets.

    Attributes:
        means: ``[B, N, 3]`` centres in world (scene-frame) units.
        scales: ``[B, N, 3]`` standard deviations along the local axes, positive.
        rotations: ``[B, N, 4]`` unit quaternions, wxyz.
        opacities: ``[B, N]`` in (0, 1).
        harmonics: ``[B, N, 3, K]`` SH coefficients, ``K = (d + 1)^2``.
        mask: ``[B, N]`` bool marking valid entries, or ``None`` when all are valid.
    """

    means: Tensor
    scales: Tensor
    rotations: Tensor
    opacities: Tensor
    harmonics: Tensor
    mask: Tensor | None = None

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> int:
        return self.means.shape[0]

    @property
    def num_slots(self) -> int:
        """Number of entries per scene, valid or not (``N``)."""
        return self.means.shape[1]

    @property
    def sh_degree(self) -> int:
        return math.isqrt(self.harmonics.shape[-1]) - 1

    @property
    def device(self) -> torch.device:
        return self.means.device

    @property
    def dtype(self) -> torch.dtype:
        return self.means.dtype

    def _tensors(self) -> dict[str, Tensor | None]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # ------------------------------------------------------------------ checks
    def validate(self, name: str = "gaussians") -> Gaussians:
        """Raise ``ValueError`` naming the field when shapes disagree or values are non-finite."""
        if self.means.ndim != 3 or self.means.shape[-1] != 3:
            raise ValueError(f"{name}.means must be [B, N, 3], got {tuple(self.means.shape)}")
        b, n = self.means.shape[:2]
        expected = {
            "scales": (b, n, 3),
            "rotations": (b, n, 4),
            "opacities": (b, n),
        }
        for key, shape in expected.items():
            value = getattr(self, key)
            if tuple(value.shape) != shape:
                raise ValueError(f"{name}.{key} must be {list(shape)}, got {tuple(value.shape)}")
        h = self.harmonics
        if h.ndim != 4 or h.shape[:3] != (b, n, 3) or math.isqrt(h.shape[3]) ** 2 != h.shape[3]:
            raise ValueError(
                f"{name}.harmonics must be [B, N, 3, (d+1)^2] with B={b}, N={n}, "
                f"got {tuple(h.shape)}"
            )
        if self.mask is not None and tuple(self.mask.shape) != (b, n):
            raise ValueError(f"{name}.mask must be [{b}, {n}], got {tuple(self.mask.shape)}")
        for key in ("means", "scales", "rotations", "opacities", "harmonics"):
            value = getattr(self, key)
            if self.mask is not None:
                value = value[self.mask]
            if not _all_finite(value):
                raise ValueError(f"{name}.{key} has non-finite values")
        if self.mask is not None:
            bad_scale = (self.scales[self.mask] <= 0).any()
        else:
            bad_scale = (self.scales <= 0).any()
        if bad_scale:
            raise ValueError(f"{name}.scales must be positive")
        return self

    # ------------------------------------------------------------------ tensor-like
    def count(self) -> Tensor:
        """Valid Gaussians per scene, ``[B]`` int64."""
        if self.mask is None:
            return torch.full(
                (self.batch_size,), self.num_slots, dtype=torch.long, device=self.device
            )
        return self.mask.sum(dim=1)

    def valid_mask(self) -> Tensor:
        """``[B, N]`` bool, all true when there is no mask."""
        if self.mask is None:
            return torch.ones(self.means.shape[:2], dtype=torch.bool, device=self.device)
        return self.mask

    def map(self, fn) -> Gaussians:
        """Apply ``fn`` to every tensor field (the mask too, when it is not ``None``)."""
        return Gaussians(
            **{k: (fn(v) if v is not None else None) for k, v in self._tensors().items()}
        )

    def to(self, *args, **kwargs) -> Gaussians:
        """Like ``Tensor.to``; the mask keeps its bool dtype."""
        out = {}
        for key, value in self._tensors().items():
            if value is None:
                out[key] = None
            elif key == "mask":
                device = next((a for a in args if isinstance(a, (str, torch.device))), None)
                device = kwargs.get("device", device)
                out[key] = value.to(device) if device is not None else value
            else:
                out[key] = value.to(*args, **kwargs)
        return Gaussians(**out)

    def detach(self) -> Gaussians:
        return self.map(lambda t: t.detach())

    def __getitem__(self, index) -> Gaussians:
        """Select scenes: ``g[0:1]``, ``g[[0, 2]]`` (an int keeps the batch dimension)."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        return self.map(lambda t: t[index])

    @staticmethod
    def cat(sets: list[Gaussians]) -> Gaussians:
        """Concatenate sets along the Gaussian dimension (same batch size and SH degree)."""
        if not sets:
            raise ValueError("Gaussians.cat needs at least one set")
        batch = {g.batch_size for g in sets}
        degrees = {g.harmonics.shape[-1] for g in sets}
        if len(batch) != 1:
            raise ValueError(f"Gaussians.cat: batch sizes differ: {sorted(batch)}")
        if len(degrees) != 1:
            raise ValueError(f"Gaussians.cat: SH coefficient counts differ: {sorted(degrees)}")
        any_mask = any(g.mask is not None for g in sets)
        out = {
            key: torch.cat([getattr(g, key) for g in sets], dim=1)
            for key in ("means", "scales", "rotations", "opacities", "harmonics")
        }
        out["mask"] = torch.cat([g.valid_mask() for g in sets], dim=1) if any_mask else None
        return Gaussians(**out)

    def __add__(self, other: Gaussians) -> Gaussians:
        return Gaussians.cat([self, other])

    def compact(self) -> Gaussians:
        """Move valid entries first and drop trailing slots invalid in every scene."""
        if self.mask is None:
            return self
        keep = int(self.count().max().item()) if self.batch_size else 0
        # Stable sort: valid (1) before invalid (0), original order otherwise.
        order = torch.argsort((~self.mask).to(torch.int8), dim=1, stable=True)[:, :keep]
        out = self._gather(order)
        if bool(out.mask.all()):
            out.mask = None
        return out

    def _gather(self, index: Tensor) -> Gaussians:
        """Gather entries ``index [B, M]`` from each scene."""

        def take(t: Tensor) -> Tensor:
            shape = index.shape + t.shape[2:]
            idx = index.reshape(*index.shape, *([1] * (t.ndim - 2))).expand(shape)
            return torch.gather(t, 1, idx)

        return Gaussians(
            means=take(self.means),
            scales=take(self.scales),
            rotations=take(self.rotations),
            opacities=take(self.opacities),
            harmonics=take(self.harmonics),
            mask=take(self.valid_mask()),
        )

    def prune(self, max_count: int | None = None, min_opacity: float | None = None) -> Gaussians:
        """Keep, per scene, the most opaque Gaussians.

        Args:
            max_count: keep at most this many per scene (the most opaque ones).
            min_opacity: drop Gaussians whose opacity is below this.

        Returns:
            A new set, padded to the largest kept count with a mask where scenes differ. Kept
            Gaussians are in descending opacity order.
        """
        if max_count is not None and max_count < 0:
            raise ValueError(f"max_count must be >= 0, got {max_count}")
        valid = self.valid_mask()
        if min_opacity is not None:
            valid = valid & (self.opacities >= min_opacity)
        score = torch.where(valid, self.opacities, torch.full_like(self.opacities, -1.0))
        order = torch.argsort(score, dim=1, descending=True, stable=True)
        keep_counts = valid.sum(dim=1)
        if max_count is not None:
            keep_counts = keep_counts.clamp(max=max_count)
        keep = int(keep_counts.max().item()) if self.batch_size else 0
        order = order[:, :keep]
        out = self._gather(order)
        ranks = torch.arange(keep, device=self.device)[None, :]
        out.mask = ranks < keep_counts[:, None]
        if bool(out.mask.all()):
            out.mask = None
        return out

    # ------------------------------------------------------------------ PLY
    def ply_attribute_names(self) -> list[str]:
        """Property names of the INRIA 3DGS PLY layout for this SH degree."""
        rest = 3 * (self.harmonics.shape[-1] - 1)
        return (
            ["x", "y", "z", "nx", "ny", "nz"]
            + [f"f_dc_{i}" for i in range(3)]
            + [f"f_rest_{i}" for i in range(rest)]
            + ["opacity"]
            + [f"scale_{i}" for i in range(3)]
            + [f"rot_{i}" for i in range(4)]
        )

    def save_ply(self, path: str | os.PathLike, index: int = 0) -> None:
        """Write scene ``index`` as an INRIA-layout binary PLY (valid entries only).

        Opacity is stored as a logit, scale as log, rotation as wxyz, ``f_rest`` channel-major.
        """
        from plyfile import PlyData, PlyElement

        if not 0 <= index < self.batch_size:
            raise IndexError(f"scene index {index} out of range for batch of {self.batch_size}")
        g = self[index].detach().to("cpu")
        valid = g.valid_mask()[0]
        means = g.means[0][valid].double()
        harmonics = g.harmonics[0][valid].double()  # [N, 3, K]
        opacity = g.opacities[0][valid].double().clamp(1e-12, 1 - 1e-12)
        columns = [
            means,
            torch.zeros_like(means),
            harmonics[:, :, 0],
            harmonics[:, :, 1:].reshape(harmonics.shape[0], -1),
            torch.log(opacity / (1 - opacity))[:, None],
            torch.log(g.scales[0][valid].double()),
            g.rotations[0][valid].double(),
        ]
        data = torch.cat(columns, dim=1).to(torch.float32).numpy()
        names = self.ply_attribute_names()
        vertex = np.empty(data.shape[0], dtype=[(name, "f4") for name in names])
        for i, name in enumerate(names):
            vertex[name] = data[:, i]
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        PlyData([PlyElement.describe(vertex, "vertex")]).write(path)

    @classmethod
    def load_ply(cls, path: str | os.PathLike) -> Gaussians:
        """Read an INRIA-layout PLY into a batch of one scene (float32)."""
        from plyfile import PlyData

        path = os.fspath(path)
        try:
            ply = PlyData.read(path)
        except Exception as error:  # plyfile raises a mix of exception types
            raise ValueError(f"{path}: not a readable PLY file ({error})") from error
        if "vertex" not in ply:
            raise ValueError(f"{path}: PLY has no 'vertex' element")
        vertex = ply["vertex"]
        present = {p.name for p in vertex.properties}
        required = (
            ["x", "y", "z"]
            + [f"f_dc_{i}" for i in range(3)]
            + ["opacity"]
            + [f"scale_{i}" for i in range(3)]
            + [f"rot_{i}" for i in range(4)]
        )
        missing = [name for name in required if name not in present]
        if missing:
            raise ValueError(f"{path}: PLY is missing required properties: {', '.join(missing)}")
        rest_names = sorted(
            (p for p in present if p.startswith("f_rest_")), key=lambda s: int(s.split("_")[-1])
        )
        if len(rest_names) % 3:
            raise ValueError(f"{path}: {len(rest_names)} f_rest properties is not a multiple of 3")
        coefficients = 1 + len(rest_names) // 3
        if math.isqrt(coefficients) ** 2 != coefficients:
            raise ValueError(f"{path}: {len(rest_names)} f_rest properties is not an SH degree")

        def column(names: list[str]) -> np.ndarray:
            if not names:
                return np.zeros((len(vertex.data), 0), dtype=np.float64)
            return np.stack([np.asarray(vertex[n], dtype=np.float64) for n in names], axis=1)

        means = torch.from_numpy(column(["x", "y", "z"]))
        dc = torch.from_numpy(column([f"f_dc_{i}" for i in range(3)]))
        rest = torch.from_numpy(column(rest_names)).reshape(len(vertex.data), 3, coefficients - 1)
        opacity = torch.sigmoid(torch.from_numpy(column(["opacity"]))[:, 0])
        scales = torch.exp(torch.from_numpy(column([f"scale_{i}" for i in range(3)])))
        rotations = torch.from_numpy(column([f"rot_{i}" for i in range(4)]))
        harmonics = torch.cat([dc[:, :, None], rest], dim=2)
        return cls(
            means=means[None].float(),
            scales=scales[None].float(),
            rotations=rotations[None].float(),
            opacities=opacity[None].float(),
            harmonics=harmonics[None].float(),
        )

    # ------------------------------------------------------------------ other formats
    def save(self, path: str | os.PathLike, index: int = 0, *, spz_version: int = 4) -> None:
        """Write scene ``index`` in the format the suffix names (valid entries only).

        ``.ply`` (INRIA, exact), ``.compressed.ply`` (PlayCanvas), ``.spz`` (Niantic; version 4,
        or 3 with ``spz_version=3``), ``.sog`` (PlayCanvas, bundled) or ``meta.json`` (SOG
        unbundled: the images beside it), ``.glb`` (``KHR_gaussian_splatting``), ``.splat``; each
        quantised as its specification does (docs/formats.md). Written atomically. Every format
        but ``.ply`` holds SH degree <= 3: higher bands (NoPoSplat's and AnySplat's degree 4) are left out, with
        a warning.
        """
        if format_of(path) == "ply":
            folder = os.path.dirname(os.path.abspath(path))
            os.makedirs(folder, exist_ok=True)
            handle, staging = tempfile.mkstemp(prefix=".splat-", suffix=".ply", dir=folder)
            os.close(handle)
            try:
                self.save_ply(staging, index)
                os.chmod(staging, 0o644)
                os.replace(staging, path)
            finally:
                if os.path.exists(staging):
                    os.unlink(staging)
            return
        if not 0 <= index < self.batch_size:
            raise IndexError(f"scene index {index} out of range for batch of {self.batch_size}")
        arrays = self._splat_arrays(index)
        if arrays.sh_degree > 3:
            warnings.warn(
                f"{path}: SH degree {arrays.sh_degree} written as degree 3 (the format holds no "
                "higher band; gaussians.ply keeps them all)",
                stacklevel=2,
            )
            arrays = replace(arrays, harmonics=arrays.harmonics[..., :16])
        write_splats(path, arrays, spz_version=spz_version)

    def _splat_arrays(self, index: int):
        g = self[index].detach().to("cpu")
        valid = g.valid_mask()[0]
        return SplatArrays(
            means=g.means[0][valid].double().numpy(),
            scales=g.scales[0][valid].double().numpy(),
            rotations=g.rotations[0][valid].double().numpy(),
            opacities=g.opacities[0][valid].double().numpy(),
            harmonics=g.harmonics[0][valid].double().numpy(),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> Gaussians:
        """Read any format :meth:`save` writes (by suffix; a folder: unbundled SOG) into a batch
        of one scene (float32). Bad files raise ``InputError`` naming the file."""
        if format_of(path) == "ply":
            try:
                with open(path, "rb") as stream:
                    head = stream.read(65536)
            except OSError as error:
                raise InputError(path, f"cannot be read ({error.strerror})") from error
            if not is_compressed_ply(head):
                try:
                    loaded = cls.load_ply(path)
                except ValueError as error:
                    raise InputError(
                        path, str(error).removeprefix(f"{os.fspath(path)}: ")
                    ) from error
                try:
                    loaded.validate()
                except ValueError as error:
                    raise InputError(path, str(error).replace("gaussians.", "")) from error
                return loaded
        splats = read_splats(path)

        def tensor(array) -> Tensor:
            return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))[None]

        return cls(
            means=tensor(splats.means),
            scales=tensor(splats.scales),
            rotations=tensor(splats.rotations),
            opacities=tensor(splats.opacities),
            harmonics=tensor(splats.harmonics),
        )

    def replace(self, **changes) -> Gaussians:
        return replace(self, **changes)


def transform_gaussians(gaussians: Gaussians, move: Similarity) -> Gaussians:
    """``gaussians`` ``[B, N]`` moved by ``move`` (unbatched or batch ``[B]``): means moved,
    scales multiplied by its scale, orientations rotated and the view-dependent colour's SH
    rotated exactly (``models.core.sh.sh_rotation``). Solved in float64, returned in their dtypes."""
    device = gaussians.means.device
    move = move.to(dtype=torch.float64, device=device)
    means = move.points(gaussians.means.double())  # [B, N, 3]
    q = matrix_to_quaternion(move.rotation)  # [4] or [B, 4]
    q = q if q.ndim == 1 else q[:, None]
    rotations = quaternion_multiply(
        q.to(gaussians.rotations).expand_as(gaussians.rotations), gaussians.rotations
    )
    factor = move.scale if move.scale.ndim == 0 else move.scale[:, None, None]
    harmonics = gaussians.harmonics
    degree = sh_degree_of(harmonics.shape[-1])
    if degree > 0:
        m = sh_rotation(move.rotation, degree)  # [K, K] or [B, K, K]
        m = m if m.ndim == 2 else m[:, None]  # [B, 1, K, K] over the N Gaussians
        harmonics = (harmonics.double() @ m.transpose(-1, -2)).to(harmonics.dtype)  # [B, N, 3, K]
    return gaussians.replace(
        means=means.to(gaussians.means.dtype),
        scales=gaussians.scales * factor.to(gaussians.scales.dtype),
        rotations=rotations,
        harmonics=harmonics,
    )
