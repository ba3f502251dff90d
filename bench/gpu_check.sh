#!/usr/bin/env bash
# GPU check for a lent machine (no internet): the PyTorch renderer against gsplat, and timings.
#
#   bash bench/gpu_check.sh [--garden PATH] [--models NAME ...] [--quick]
#
# Installs the gsplat wheel carried in .whl/ (when present) into /tmp/site, builds gsplat's CUDA
# extension for Hopper (TORCH_CUDA_ARCH_LIST=9.0, MAX_JOBS=16), runs the gpu-marked renderer tests
# (torch backend vs gsplat in classic and antialiased rasterize modes) and then bench/gpu_check.py
# (parity, render timing, per-family reconstruction and the refinement step: gsplat / torch / cpu).
# The whole script is bounded to 8 minutes; the report is printed and also written to
# $OUT/gpu_check.md when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
log=${OUT:-/tmp}/gpu_check.md
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  # 1. Build gsplat's extension once (the first import compiles it; later imports load it).
  timeout 330 python3 -c "import time; t = time.time(); from gsplat.cuda._backend import _C; \
print('gsplat extension:', 'ready' if _C is not None else 'MISSING', f'({time.time() - t:.0f} s)')" \
    || echo "gsplat build failed or timed out"
  # 2. The gpu-marked renderer tests (parity with gsplat, including the garden scene if present,
  #    and rasterize_mode="antialiased": test_torch_matches_gsplat_antialiased, forward + gradients).
  left=$((470 - (SECONDS - start)))
  timeout $((left / 3)) python3 -m pytest tests/test_render.py -q -m gpu -p no:cacheprovider \
    || echo "gpu tests failed or timed out"
  # 3. Parity and timing tables.
  left=$((470 - (SECONDS - start)))
  timeout "$left" python3 bench/gpu_check.py "$@" || echo "gpu_check.py failed (exit $?)"
  echo "wall time $((SECONDS - start)) s"
} 2>&1 | tee "$log"
