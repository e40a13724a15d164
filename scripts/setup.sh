#!/usr/bin/env bash
# One idempotent set-up for a fresh machine: Debian packages (as root), the virtual
# environment .venv and the pinned Python dependencies. Safe to run again: it only does
# what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the workloads run for real: pw.x and its pseudopotentials, Open MPI with
# UCX, and the compilers mpi4py needs. Slurm (with munge and its PBS-style qsub/qstat/qdel
# wrappers) and iproute2 run the virtual test cluster (scripts/virtual-cluster.sh).
# chromium: the HTML report is checked in a headless browser at desktop and phone widths.
APT_PACKAGES=(quantum-espresso quantum-espresso-data openmpi-bin libopenmpi-dev ucx-utils
              slurm-wlm slurm-wlm-torque munge iproute2 chromium)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # wait for another apt/dpkg (a second checkout's set-up) instead of failing at once
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: not root, so these Debian packages were not installed: ${missing[*]}" >&2
    echo "setup: install them with: sudo apt-get install -y ${missing[*]}" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi

# Re-install only when the pinned set or the package metadata changed.
stamp=.venv/.tunelab-setup
want=$(cat pyproject.toml requirements.lock scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup: installing Python dependencies into .venv (pinned by requirements.lock)"
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
# torch first and pinned: the CPU wheel lies on disk; an unpinned torch pulls a CUDA build.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -c requirements.lock -e ".[leopard,merge,ddp,dev]"
.venv/bin/python -m tunelab.workloads.qe.pseudo --ensure || echo "setup: the Ce pseudopotential was not generated (needs ld1.x from quantum-espresso); the qe workload retries on first use" >&2
echo "$want" > "$stamp"
echo "setup: done"
