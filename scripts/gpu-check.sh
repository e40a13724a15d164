#!/usr/bin/env bash
# The device checks of the GPU issues, one call each on a lent GPU machine (the device tool:
# ../.library/device/README.md). First, here: bash scripts/gpu-wheels.sh. Then, with the tool:
#
#   run(command="bash scripts/gpu-check.sh leopard", carry=[".whl"], timeout_s=480)   # issue 26
#   run(command="bash scripts/gpu-check.sh ddp", carry=[".whl"], timeout_s=480)       # issue 27
#
# Each installs the carried wheels beside the image's own packages, prints the machine, runs
# the issue's `-m cuda` tests and its benchmark script (figures and logs under $OUT, which comes
# back), then spends what is left of SECONDS_TOTAL (default 360) on the other `-m "not slow"` tests
# of its part with CUDA visible, cut off there and saying so. A GPU session has 15 minutes of
# device time, a machine's start (1-2 min) included: the two checks at 360 s fit one after the
# other on the warm machine (call the second at once: it goes back after 30 s idle); with less
# time left, give the second less: run(command="SECONDS_TOTAL=240 bash scripts/gpu-check.sh ddp").
# SUITE=0 leaves the suite out.
#
#   bash scripts/gpu-check.sh --rehearse leopard|ddp      # here, on the CPU, at tiny sizes
#
# --rehearse runs the same steps on this machine's CPU in a venv that holds only what the GPU
# image holds (GPU_PYTHON, default /tmp/gpu-image/bin/python; torch 2.11 as there) with the
# wheels of `bash scripts/gpu-wheels.sh --python-version 3.11 /tmp/gpu-wheels` (GPU_WHEELS):
# what would fail there for a missing package or an older torch fails here first. That venv
# (torch's CUDA build, ~4 GB, runs on the CPU): python3 -m venv /tmp/gpu-image &&
# /tmp/gpu-image/bin/pip install torch==2.11.0 torchvision==0.26.0 numpy pandas scipy pyarrow
# matplotlib jinja2 psutil regex pyyaml typer rich pillow nvidia-ml-py pytest pytest-timeout
# hypothesis packaging tqdm && /tmp/gpu-image/bin/pip uninstall -y pydantic pydantic_core
# annotated-types typing-inspection   (the image has none of these four).
set -uo pipefail

REHEARSE=0
if [ "${1:-}" = "--rehearse" ]; then REHEARSE=1; shift; fi
WHAT=${1:-}
case "$WHAT" in leopard | ddp) ;; *)
  echo "usage: bash scripts/gpu-check.sh [--rehearse] leopard|ddp" >&2; exit 2 ;;
esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SECONDS_TOTAL=${SECONDS_TOTAL:-360}
if [ "$REHEARSE" = 1 ]; then
  PY=${GPU_PYTHON:-/tmp/gpu-image/bin/python}
  WHEELS=${GPU_WHEELS:-/tmp/gpu-wheels}
  OUT=${OUT:-$(mktemp -d /tmp/gpu-check-out.XXXXXX)}
  SITE=$(mktemp -d /tmp/gpu-check-site.XXXXXX)
  trap 'rm -rf "$SITE"' EXIT
  SIZE=(--tiny --device cpu)
  FETCH="bash scripts/gpu-wheels.sh --python-version 3.11 $WHEELS"
else
  PY=python3
  WHEELS=.whl
  [ -n "${OUT:-}" ] || {
    echo "gpu-check: OUT is unset: run this through the device tool, or with --rehearse" >&2
    exit 2; }
  SITE=/tmp/site
  SIZE=()
  FETCH="bash scripts/gpu-wheels.sh (here, then carry .whl)"
fi
[ -x "$PY" ] || command -v "$PY" >/dev/null || { echo "gpu-check: no Python at $PY" >&2; exit 2; }
ls "$WHEELS"/*.whl >/dev/null 2>&1 || {
  echo "gpu-check: no wheels in $WHEELS: run $FETCH first" >&2; exit 2; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$WHEELS"/*.whl || { echo "gpu-check: the wheels did not install" >&2; exit 1; }
# The tree's src first: the code run is this checkout's; the tunelab wheel in SITE adds only
# the distribution's metadata (the workload entry points).
export PYTHONPATH="$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"

left() { echo $((SECONDS_TOTAL - SECONDS)); }
# what is left for a benchmark, keeping RESERVE seconds back for what follows it (30 at least)
budget_for() { local b=$(( $(left) - $1 )); echo $(( b > 30 ? b : 30 )); }
step() { echo; echo "### $* [$SECONDS s in, $(left) s left]"; }
FAILED=()
# run_step FILE TITLE COMMAND...: COMMAND's output to the screen and to $OUT/FILE; its exit
# status in LAST_RC, and TITLE in FAILED unless it is 0 (or 124, a suite cut off on purpose)
run_step() {
  local file=$1 title=$2
  shift 2
  step "$title" | tee -a "$OUT/$file"
  "$@" 2>&1 | tee -a "$OUT/$file"
  LAST_RC=${PIPESTATUS[0]}
  case "$LAST_RC" in 0 | 124) ;; *) FAILED+=("$title: exit $LAST_RC") ;; esac
}
machine() {
  date -u +"%F %T UTC"
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  echo "$(nproc) cores"
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| CUDA", torch.version.cuda, "| device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'
  # the device's copy may hold a .git of an older commit: the wheels' record is the tree's
  echo "tree: the wheels were made from $(cat "$WHEELS/TREE" 2>/dev/null || echo '? (no TREE)')"
}

run_step machine.txt machine machine
if [ "$WHAT" = leopard ]; then
  run_step cuda_tests.txt "pytest -m cuda tests/leopard" \
    "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/leopard
  budget=$(budget_for 45)
  run_step leopard_gpu.txt "benchmarks/leopard_gpu.py --budget $budget" \
    "$PY" benchmarks/leopard_gpu.py --budget "$budget" --work /tmp/lg "${SIZE[@]}" \
    --json "$OUT/leopard_gpu.json"
  SUITE_FILES=(tests/leopard)
else
  budget=$(budget_for 75)
  run_step ddp_gpu.txt "benchmarks/ddp_gpu.py --budget $budget" \
    "$PY" benchmarks/ddp_gpu.py --budget "$budget" --dir /tmp/ddp-gpu "${SIZE[@]}"
  run_step cuda_tests.txt "pytest -m cuda tests/bench tests/execute/test_gpuwatch.py" \
    "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/bench tests/execute/test_gpuwatch.py
  SUITE_FILES=(tests/bench/test_ddp_*.py)
fi

rest=$(left)
if [ "${SUITE:-1}" = 1 ] && [ "$rest" -gt 30 ]; then
  # the cuda tests ran in their own step above
  run_step suite.txt "pytest -m 'not slow and not cuda' ${SUITE_FILES[*]} (CUDA visible), cut off after $rest s" \
    timeout -k 10 "$rest" "$PY" -m pytest -q -p no:cacheprovider -m "not slow and not cuda" \
    "${SUITE_FILES[@]}"
  [ "$LAST_RC" = 124 ] && echo "gpu-check: the suite was cut off at $rest s" | tee -a "$OUT/suite.txt"
fi
# the tool brings back 8 files at most: the per-run logs go as one archive
if [ -d "$OUT/leopard_gpu_logs" ]; then
  tar -czf "$OUT/leopard_gpu_logs.tgz" -C "$OUT" leopard_gpu_logs && rm -r "$OUT/leopard_gpu_logs"
fi
step "done: $(ls "$OUT" | tr '\n' ' ')in $OUT"
if [ ${#FAILED[@]} -gt 0 ]; then
  printf 'gpu-check: FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
