#!/bin/sh
# make gpu-check's body, and the whole of the one device call on a lent GPU machine:
#   sh benchmarks/gpu_check.sh [gpu_check's flags]
# No venv, no registry: the machine's python3 (PY= picks another) with the checkout's package folders on
# PYTHONPATH. Where that python cannot import the runtime's own packages (pydantic, llguidance, FastAPI,
# uvicorn, orjson) and .gpu-wheels holds them (`make gpu-wheels`, run beforehand on a machine that reaches
# PyPI), they are installed into a throwaway folder first; a failed install is reported, and the steps that
# need them are then skipped with the module named.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python3}
ROOT=$(pwd)
if ! $PY -c "import pydantic, llguidance, fastapi, uvicorn, orjson" 2>/dev/null && ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  SITE=$(mktemp -d)
  if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .gpu-wheels/*.whl; then
    PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu-check: installed $(ls .gpu-wheels/*.whl | wc -l) wheels from .gpu-wheels into $SITE"
  else
    echo "gpu-check: installing .gpu-wheels failed; steps that need those packages will be skipped"
  fi
fi
export PYTHONPATH="$ROOT:$ROOT/kernels:$ROOT/integrations:$ROOT/benchmarks:$ROOT/training:$ROOT/testkit${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec $PY -m leyline_bench.gpu.check "$@"
