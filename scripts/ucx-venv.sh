#!/usr/bin/env bash
# An optional virtual environment with UCXX (the merge workload's `ucxx` transport and Dask's
# `ucxx` protocol) and dask-cuda (its merge benchmark, the peer in
# benchmarks/merge_vs_peers.py). It is kept out of the project's .venv on purpose: RAPIDS pins
# its own dask/distributed (rapids-dask-dependency).
#
#   bash scripts/ucx-venv.sh [DIR]      # default $TUNELAB_UCXX_VENV or ~/.cache/tunelab/ucx-venv
#   TUNELAB_UCXX_PYTHON=DIR/bin/python .venv/bin/python -m pytest tests/bench -k ucxx
#   .venv/bin/python benchmarks/merge_vs_peers.py --ucxx-python DIR/bin/python \
#       --dask-cuda-python DIR/bin/python
#
# Install facts (machine-recipes): the CUDA 12 wheels run on a CPU-only machine (UCX inside the
# wheel: tcp, posix, sysv, cma); an unpinned distributed-ucxx may backtrack to an old stub that
# downloads from an unreachable index, so every RAPIDS package is pinned to one release.
# tunelab itself is installed editable from this checkout (with its merge extra: mpi4py, dask),
# so the workers run the code of the tree that calls them.
#
# A few minutes on a fresh machine; a second run only checks that ucxx and dask_cuda import.
set -euo pipefail

DIR=${1:-${TUNELAB_UCXX_VENV:-$HOME/.cache/tunelab/ucx-venv}}
. "$(dirname "${BASH_SOURCE[0]}")/venv-common.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Pinned: one RAPIDS release (26.10 / UCXX 0.52), the one the merge benchmarks were run with.
PACKAGES=("ucxx-cu12==0.52.0" "distributed-ucxx-cu12==0.52.0" "dask-cuda==26.10.0"
          "rapids-dask-dependency==26.10.0")

check() {
  "$DIR/bin/python" -c "import ucxx, dask_cuda, tunelab.bench.merge" 2>/dev/null
}

if [ -x "$DIR/bin/python" ] && check; then
  echo "ucx-venv: $DIR already has UCXX ($("$DIR/bin/python" -m pip show ucxx-cu12 2>/dev/null | sed -n 's/^Version: //p'))"
  exit 0
fi
echo "ucx-venv: creating $DIR (${PACKAGES[*]}, tunelab[merge] from $ROOT)"
new_venv "$DIR"
"$DIR/bin/python" -m pip install -q "${PACKAGES[@]}" -e "$ROOT[merge]"
check || { echo "ucx-venv: ucxx or dask_cuda does not import in $DIR" >&2; exit 1; }
echo "ucx-venv: done; export TUNELAB_UCXX_PYTHON=$DIR/bin/python"
