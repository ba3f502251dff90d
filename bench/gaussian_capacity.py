"""How good can a Gaussian set of a given size get on the synthetic test scenes?

    python bench/gaussian_capacity.py --weights CKPT_OR_DIR [CKPT_OR_DIR ...] [--steps 300]
        [--max-scenes 6] [--lr 0.01] [--threads N] [--json OUT.json]

For each model: predict a scene's Gaussians feed-forward, then optimise every parameter of that
set (means, scales, rotations, opacities, SH) per scene with Adam on the context views, with the
ground-truth cameras, as a per-scene 3DGS fit would, and score the target views before and after.
The optimised figure bounds what a feed-forward model with that many Gaussians and that starting
layout can reach on those targets (a fit to two views can overfit, so it is not a strict bound,
but a network is not better at novel views than a per-scene fit of its own set). Counts stay
fixed: no densification or pruning. Prints a Markdown table.

``bench/results/capacity/capacity.json`` holds the output of (the ZipSplat checkpoint is a
training run's, ``experiment=synthetic_zipsplat``)::

    python bench/gaussian_capacity.py --weights <zipsplat ckpt> checkpoints/pixel_aligned_tiny \\
        checkpoints/splatweaver_tiny --max-scenes 6 --steps 200 --threads 1 \\
        --json bench/results/capacity/capacity.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import data_config, load_weights, score_targets, test_loader  # noqa: E402

from models import Gaussians, render  # noqa: E402


def fit_to_context(gaussians: Gaussians, context: dict, steps: int, lr: float) -> Gaussians:
    """``gaussians`` optimised for ``steps`` Adam steps to render the context views."""
    images = context["image"]
    shape = (int(images.shape[-2]), int(images.shape[-1]))
    params = {
        "means": gaussians.means.detach().clone(),
        "log_scales": gaussians.scales.detach().clamp_min(1e-6).log(),
        "rotations": gaussians.rotations.detach().clone(),
        "opacity_logits": torch.logit(gaussians.opacities.detach().clamp(1e-4, 1 - 1e-4)),
        "harmonics": gaussians.harmonics.detach().clone(),
    }
    for value in params.values():
        value.requires_grad_(True)
    # the means move in scene units; a step of lr * scene scale
    scale = gaussians.means.detach().norm(dim=-1).median().clamp_min(1e-3)
    optimizer = torch.optim.Adam(
        [
            {"params": [params["means"]], "lr": lr * float(scale) * 0.1},
            {"params": [params[k] for k in params if k != "means"], "lr": lr},
        ]
    )

    def current() -> Gaussians:
        return gaussians.replace(
            means=params["means"],
            scales=params["log_scales"].exp(),
            rotations=F.normalize(params["rotations"], dim=-1),
            opacities=torch.sigmoid(params["opacity_logits"]),
            harmonics=params["harmonics"],
        )

    for _ in range(steps):
        out = render(current(), context["extrinsics"], context["intrinsics"], shape)
        loss = (out.color - images).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return current()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--max-scenes", type=int, default=6)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    loader = test_loader(data_config())
    rows = []
    for location in args.weights:
        model = load_weights(location)
        before, after, context_after, count = [], [], [], []
        start = time.perf_counter()
        for i, batch in enumerate(loader):
            if i >= args.max_scenes:
                break
            with torch.no_grad():
                gaussians = model(batch["context"]).gaussians
                before.append(score_targets(gaussians, batch["target"])["psnr"])
            fitted = fit_to_context(gaussians, batch["context"], args.steps, args.lr)
            with torch.no_grad():
                scores = score_targets(fitted, batch["target"])
                after.append(scores["psnr"])
                count.append(scores["gaussians"])
                context_after.append(score_targets(fitted, batch["context"])["psnr"])
        row = {
            "weights": location,
            "gaussians": float(torch.cat(count).mean()),
            "psnr_feed_forward": float(torch.cat(before).mean()),
            "psnr_fitted": float(torch.cat(after).mean()),
            "context_psnr_fitted": float(torch.cat(context_after).mean()),
            "scenes": len(before),
            "seconds": time.perf_counter() - start,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{args.max_scenes} test scenes, {args.steps} Adam steps on the context views\n")
    print("| weights | Gaussians | target PSNR feed-forward | after fit | context PSNR after fit |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['weights']} | {r['gaussians']:,.0f} | {r['psnr_feed_forward']:.2f} | "
            f"{r['psnr_fitted']:.2f} | {r['context_psnr_fitted']:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
