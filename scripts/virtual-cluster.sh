#!/usr/bin/env bash
# A virtual Slurm cluster on this machine (root): N network namespaces with their own host
# names, joined by veth pairs to a bridge, running munge, slurmctld and one slurmd per node.
#   scripts/virtual-cluster.sh up N [--rate 1gbit] [--cpus 2]   prints: export SLURM_CONF=…
#   eval "$(scripts/virtual-cluster.sh up 2)"; sinfo; sbatch -N2 --wrap 'srun hostname'
#   scripts/virtual-cluster.sh down [PREFIX…]     (no prefix: every virtual cluster)
#   scripts/virtual-cluster.sh status
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec "$PY" -m tunelab.cluster "$@"
