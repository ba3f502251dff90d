"""Ports of released weights against outputs of their official code (recorded as fixtures).

    python bench/official_parity.py [--port zipsplat_da3] [--giant] [--threads N]

For each port: the deterministic weights of its test recipe are mapped through the port's
``checkpoint_filter_fn``, the port runs on the recipe's inputs, and the max abs error of every
output field against the official outputs stored in ``tests/fixtures/<port>/`` is printed as a
Markdown table (one row per case). How the fixtures were made: ``tests/fixtures/<port>/README.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests")]


def zipsplat_da3(giant: bool = False) -> list[dict]:
    """ZipSplat's release (DA3): DA3-S cases, and the released giant's with ``giant``."""
    import zipsplat_da3_recipe as recipe
    from safetensors.torch import load_file

    from models import create_model
    from models.families.zipsplat_da3 import checkpoint_filter_fn

    rows = []
    for size in ("s", "g") if giant else ("s",):
        path = recipe.FIXTURES / f"official_{size}.safetensors"
        if not path.exists():
            print(f"{path}: missing, skipped", file=sys.stderr)
            continue
        reference = load_file(path)
        state = recipe.deterministic_state_dict(recipe.load_manifest(size))
        with torch.device("meta"):
            model = create_model(f"zipsplat_da3{size}")
        mapped = checkpoint_filter_fn(recipe.release_container(state, size), model)
        model.load_state_dict(mapped, assign=True)
        model.eval()
        del state, mapped
        for name, (case_size, views, h, w, r, prior) in recipe.CASES.items():
            if case_size != size:
                continue
            context = {"image": recipe.fixture_images(views, h, w)}
            if prior:
                context["extrinsics"], context["intrinsics"] = recipe.fixture_cameras(views)
            start = time.perf_counter()
            with torch.no_grad():
                out = model(context, compression=r, camera_prior=prior)
            seconds = time.perf_counter() - start
            g, pick = out.gaussians, reference[f"{name}/index"]
            official = {
                "means": reference[f"{name}/means"],
                "scales": reference[f"{name}/scales"],
                "rotations": reference[f"{name}/quats"],
                "opacities": reference[f"{name}/opacities"],
                "harmonics": reference[f"{name}/sh_coeffs"].transpose(-1, -2),
            }
            row = {"port": "zipsplat_da3", "case": name, "gaussians": g.means.shape[1]}
            for field, value in official.items():
                row[field] = float((getattr(g, field)[:, pick] - value).abs().max())
            row["same_tokens"] = bool(
                torch.equal(out.extras["scene_token_index"], reference[f"{name}/scene_token_index"])
            )
            row["forward_s"] = seconds
            rows.append(row)
        del model
    return rows


PORTS = {"zipsplat_da3": zipsplat_da3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", choices=sorted(PORTS), action="append")
    parser.add_argument("--giant", action="store_true", help="also the released giant (~6 GB)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for port in args.port or sorted(PORTS):
        rows += PORTS[port](giant=args.giant)
    fields = ["means", "scales", "rotations", "opacities", "harmonics"]
    print(
        "| port | case | Gaussians | "
        + " | ".join(f"{f} max err" for f in fields)
        + " | same scene tokens | forward s |"
    )
    print("|" + "---|" * (len(fields) + 5))
    for row in rows:
        errors = " | ".join(f"{row[f]:.2e}" for f in fields)
        print(
            f"| {row['port']} | {row['case']} | {row['gaussians']} | {errors} | "
            f"{row['same_tokens']} | {row['forward_s']:.1f} |"
        )
    worst = max((row[f] for row in rows for f in fields), default=float("nan"))
    print(f"\nworst max abs error: {worst:.2e} (tolerance 1e-4)")
    return 0 if rows and worst <= 1e-4 else 1


if __name__ == "__main__":
    raise SystemExit(main())
