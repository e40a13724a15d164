#!/usr/bin/env bash
# The wheels a lent GPU machine lacks, fetched here into .whl/ (ignored by git, carried by the
# device tool), so that its 15 minutes go to the device checks and not to set-up.
#
#   bash scripts/gpu-wheels.sh [--python-version 3.12] [DIR]     # default DIR: .whl
#   then, with the device tool:  run(command="bash scripts/gpu-check.sh leopard", carry=[".whl"])
#
# The GPU image (../.library/device/KINDS.md: Python 3.12, torch 2.11, torchvision 0.26, numpy,
# scipy, pandas, pyarrow, matplotlib, jinja2, rich, typer, psutil, regex, PyYAML, pytest,
# hypothesis, pillow, nvidia-ml-py) has no internet; tunelab needs these besides. Pinned: the
# releases machine-recipes.md verified there. tunelab itself goes as a wheel too (no build
# there): its dist-info carries the workload entry points; the code run is the tree's own src/.
#
# --python-version 3.11 fetches the same releases for this machine's Python: scripts/gpu-check.sh
# --rehearse runs the device checks on the CPU in a venv that holds only what the image holds.
set -euo pipefail

PYVER=3.12
if [ "${1:-}" = "--python-version" ]; then PYVER=$2; shift 2; fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-$ROOT/.whl}
PACKAGES=(pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0
          typing-inspection==0.4.5 pyBigWig==0.3.29 pyfaidx==0.9.2.2 optuna==5.0.0
          alembic==1.20.1 SQLAlchemy==2.1.9 colorlog==6.12.0 Mako==1.4.3 cmaes==0.13.1
          typing_extensions==4.16.0 isal==1.9.1)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)

mkdir -p "$DIR"
if [ "$DIR" = "$ROOT/.whl" ]; then
  exclude=$(git -C "$ROOT" rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
fi
rm -f "$DIR"/tunelab-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp "${PLATFORMS[@]/#/--platform=}" -d "$DIR" "${PACKAGES[@]}"
python3 -m pip wheel -q --no-deps -w "$DIR" "$ROOT"
# which tree the wheels were made from (the device gets no .git): gpu-check.sh prints it
git -C "$ROOT" log -1 --format="%h %s" > "$DIR/TREE" 2>/dev/null || echo "not a git checkout" > "$DIR/TREE"
[ -z "$(git -C "$ROOT" status --porcelain 2>/dev/null)" ] || echo "(with uncommitted changes)" >> "$DIR/TREE"
echo "gpu-wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR (Python $PYVER)"
