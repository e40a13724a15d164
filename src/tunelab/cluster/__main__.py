"""``python -m tunelab.cluster up N | down [PREFIX…] | status``: a virtual Slurm cluster that
outlives the command (for demos and by-hand runs; tests use the pytest fixture instead).

``up`` prints the ``export SLURM_CONF=…`` line a shell needs to reach the cluster; ``down``
without a prefix removes the clusters ``up`` started from this directory (never one a live
process owns, such as a test session's, nor another checkout's).
"""

from __future__ import annotations

import argparse
import os
import sys

from tunelab.cluster.slurm import SLURM_ROOT, VirtualCluster, teardown_cluster
from tunelab.cluster.vnodes import MAX_NODES, iter_prefixes, load_state
from tunelab.errors import TunelabError


def _started_by_up(prefix: str) -> bool:
    """True for sets that ``up`` made from this checkout: no owner process, this working
    directory as origin (a test session's, or another checkout's, are left alone)."""
    state = load_state(prefix)
    return state is not None and state.get("owner_pid") is None and \
        state.get("origin") == os.getcwd()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="virtual-cluster", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start N virtual nodes with Slurm on them")
    up.add_argument("n", type=int, help=f"number of nodes (1 to {MAX_NODES})")
    up.add_argument("--rate", help="tc tbf rate limit per node link, e.g. 1gbit")
    up.add_argument("--cpus", type=int, default=2, help="CPUs Slurm sees per node")
    down = sub.add_parser("down", help="stop virtual clusters: the given prefixes, else every "
                                       "one 'up' started (not those a live process owns)")
    down.add_argument("prefixes", nargs="*", help="prefixes such as tl0")
    sub.add_parser("status", help="list the virtual clusters of this machine")
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            cluster = VirtualCluster.start(args.n, rate=args.rate, cpus=args.cpus, owner=False)
            nodes = cluster.nodes
            print(f"virtual cluster {nodes.prefix}: {args.n} nodes "
                  f"({', '.join(f'{n.name}={n.address}' for n in nodes.nodes)}), "
                  f"controller {nodes.bridge_address}", file=sys.stderr)
            print(f"export SLURM_CONF={cluster.slurm.conf}")
        elif args.action == "down":
            prefixes = [p for p in args.prefixes if not p.isdigit()] or [
                p for p in iter_prefixes() if _started_by_up(p)]
            for prefix in prefixes:
                teardown_cluster(prefix)
                print(f"virtual cluster {prefix}: down", file=sys.stderr)
        else:
            for prefix in iter_prefixes():
                conf = SLURM_ROOT / prefix / "slurm.conf"
                print(f"{prefix} SLURM_CONF={conf if conf.exists() else '-'}")
    except TunelabError as exc:
        print(f"virtual-cluster: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
