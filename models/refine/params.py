"""The optimised parameters of one Gaussian set and their Adam optimiser, with the operations
densification needs (select/append rows, reset the moments of some rows) applied to both at once."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from models.gaussians import Gaussians

__all__ = ["GaussianParameters", "NAMES"]

#: Raw parameters: means ``[N, 3]``, log-scales ``[N, 3]``, raw quaternions ``[N, 4]``, opacity
#: logits ``[N]``, SH DC ``[N, 3, 1]`` and higher bands ``[N, 3, K - 1]``.
NAMES = ("means", "scales", "rotations", "opacities", "sh_dc", "sh_rest")


class GaussianParameters:
    """Leaf tensors (one Adam parameter group each, named by :data:`NAMES`)."""

    def __init__(self, gaussians: Gaussians, sh_degree: int, lrs: dict[str, float]) -> None:
        g = gaussians.detach()
        if g.mask is not None:
            g = g.compact()
        valid = g.valid_mask()[0]
        coefficients = (sh_degree + 1) ** 2
        harmonics = g.harmonics[0][valid].float()  # [N, 3, K0]
        if harmonics.shape[-1] >= coefficients:
            harmonics = harmonics[..., :coefficients]
        else:
            pad = coefficients - harmonics.shape[-1]
            harmonics = F.pad(harmonics, (0, pad))
        opacity = g.opacities[0][valid].float().clamp(1e-6, 1 - 1e-6)
        values = {
            "means": g.means[0][valid].float(),
            "scales": g.scales[0][valid].float().clamp_min(1e-12).log(),
            "rotations": F.normalize(g.rotations[0][valid].float(), dim=-1),
            "opacities": torch.logit(opacity),
            "sh_dc": harmonics[..., :1],
            "sh_rest": harmonics[..., 1:],
        }
        self.sh_degree = sh_degree
        self.tensors = {k: v.clone().contiguous().requires_grad_(True) for k, v in values.items()}
        self.optimizer = torch.optim.Adam(
            [{"params": [self.tensors[k]], "lr": lrs[k], "name": k} for k in NAMES], eps=1e-15
        )

    @property
    def count(self) -> int:
        return self.tensors["means"].shape[0]

    def gaussians(self, degree: int | None = None) -> Gaussians:
        """The activated set (a batch of one), SH truncated to ``degree`` bands (differentiable)."""
        t = self.tensors
        harmonics = torch.cat([t["sh_dc"], t["sh_rest"]], dim=-1)
        if degree is not None:
            harmonics = harmonics[..., : (degree + 1) ** 2]
        return Gaussians(
            means=t["means"][None],
            scales=t["scales"].exp()[None],
            rotations=F.normalize(t["rotations"], dim=-1)[None],
            opacities=torch.sigmoid(t["opacities"])[None],
            harmonics=harmonics[None],
        )

    def set_lr(self, name: str, lr: float) -> None:
        for group in self.optimizer.param_groups:
            if group["name"] == name:
                group["lr"] = lr

    def _replace(self, name: str, value: Tensor, moments) -> None:
        """Swap parameter ``name`` for ``value``; ``moments(old_moment) -> new_moment``."""
        old = self.tensors[name]
        new = value.detach().contiguous().requires_grad_(True)
        for group in self.optimizer.param_groups:
            if group["name"] != name:
                continue
            state = self.optimizer.state.pop(old, None)
            group["params"] = [new]
            if state:
                for key in ("exp_avg", "exp_avg_sq"):
                    state[key] = moments(state[key])
                self.optimizer.state[new] = state
        self.tensors[name] = new

    def select_and_append(self, index: Tensor, extra: dict[str, Tensor] | None = None) -> None:
        """Keep rows ``index`` (in that order), then append ``extra`` rows with zero moments."""
        for name in NAMES:
            kept = self.tensors[name].detach()[index]
            add = extra[name].detach() if extra else kept[:0]
            self._replace(
                name,
                torch.cat([kept, add.to(kept)]),
                lambda m, add=add: torch.cat([m[index], torch.zeros_like(add, dtype=m.dtype)]),
            )

    @torch.no_grad()
    def assign(self, index: Tensor, values: dict[str, Tensor]) -> None:
        """Overwrite rows ``index`` of the named parameters in place."""
        for name, value in values.items():
            self.tensors[name][index] = value.to(self.tensors[name])

    @torch.no_grad()
    def reset_moments(self, index: Tensor | None, names: tuple[str, ...] = NAMES) -> None:
        """Zero Adam's moments of rows ``index`` (``None``: all rows) of ``names``."""
        for name in names:
            state = self.optimizer.state.get(self.tensors[name])
            if not state:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                if index is None:
                    state[key].zero_()
                else:
                    state[key][index] = 0

    def state_dict(self) -> dict:
        return {
            "tensors": {k: v.detach().clone() for k, v in self.tensors.items()},
            "optimizer": self.optimizer.state_dict(),
            "sh_degree": self.sh_degree,
        }

    def load_state_dict(self, state: dict) -> None:
        self.sh_degree = int(state["sh_degree"])
        for name in NAMES:
            self._replace(name, state["tensors"][name], lambda m: m)
        self.optimizer.state.clear()
        self.optimizer.load_state_dict(state["optimizer"])
