"""Link limits between ranks, through the MPI stack a workload uses.

:func:`link_rates` starts the link probe (:mod:`tunelab.bounds.linkprobe`) under ``mpirun``
with a stack: ``mpi-ob1`` (Open MPI's own point-to-point layer) or ``mpi-ucx`` (the UCX PML,
selected with ``OMPI_MCA_pml=ucx OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any`` as
the merge benchmark selects it, so ``UCX_*`` variables in the environment apply to both). In
a batch allocation of several nodes (or with a hostfile) the ranks go one per node, so the
limit is the network's; otherwise they share this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tunelab.cluster.allocation import allocation_hosts, write_hostfile
from tunelab.cluster.mpi import mpirun_argv, mpirun_env
from tunelab.errors import TunelabError

__all__ = ["LINK_STACKS", "LinkResult", "LinkRun", "link_rates", "stack_env"]

LINK_STACKS = ("mpi-ob1", "mpi-ucx")


@dataclass(frozen=True)
class LinkResult:
    """The samples of one pattern at one message size (bytes/s per rank)."""

    pattern: str
    message_bytes: int
    ranks: int
    samples: tuple[float, ...]


@dataclass(frozen=True)
class LinkRun:
    """One probe run: its results, the hosts its ranks ran on and the command."""

    stack: str
    results: tuple[LinkResult, ...]
    hosts: tuple[str, ...]
    argv: tuple[str, ...] = field(default=())

    @property
    def nodes(self) -> int:
        """Distinct hosts the ranks ran on."""
        return max(1, len(self.hosts))


def stack_env(stack: str) -> dict[str, str]:
    """The Open MPI variables that select ``stack``'s point-to-point layer."""
    if stack == "mpi-ob1":
        return {"OMPI_MCA_pml": "ob1"}
    if stack == "mpi-ucx":
        return {"OMPI_MCA_pml": "ucx", "OMPI_MCA_pml_ucx_tls": "any",
                "OMPI_MCA_pml_ucx_devices": "any"}
    raise TunelabError(f"unknown link stack {stack!r}; valid: {', '.join(LINK_STACKS)}")


def _placement(ranks: int | None, hostfile: Path | None, tmp: Path,
               environ: Mapping[str, str]) -> tuple[int, list[str]]:
    """Ranks and extra mpirun arguments: one rank per node of an allocation of several
    nodes (or of the hostfile), else ``ranks`` (default 2) on this machine."""
    if hostfile is not None:
        hosts = [ln.split()[0] for ln in hostfile.read_text().splitlines() if ln.strip()
                 and not ln.lstrip().startswith("#")]
        return ranks or max(2, len(hosts)), ["--hostfile", str(hostfile), "--bind-to", "none"]
    hosts = allocation_hosts(environ)
    if len(hosts) > 1:
        path = write_hostfile(tmp / "hosts", hosts, 1)
        return ranks or len(hosts), ["--hostfile", str(path), "--map-by", "node",
                                     "--bind-to", "none"]
    return ranks or 2, []


def link_rates(stack: str, *, patterns: Sequence[str], sizes: Sequence[int],
               ranks: int | None = None, repeats: int = 5, block_bytes: int = 64 << 20,
               hostfile: Path | None = None, mpirun: str = "mpirun",
               python: str | None = None, timeout: float = 300.0,
               environ: Mapping[str, str] | None = None) -> LinkRun:
    """Run the probe once over ``stack`` for every pattern and size."""
    env_in = dict(os.environ if environ is None else environ)
    with tempfile.TemporaryDirectory(prefix="tunelab-link-") as tmp:
        n, extra = _placement(ranks, hostfile, Path(tmp), env_in)
        if n < 2:
            raise TunelabError(f"a link bound needs at least 2 ranks, got {n}")
        argv = [*mpirun_argv(n, mpirun=mpirun, extra_args=extra),
                python or sys.executable, "-m", "tunelab.bounds.linkprobe",
                "--patterns", ",".join(patterns), "--sizes", ",".join(map(str, sizes)),
                "--repeats", str(repeats), "--block-bytes", str(block_bytes)]
        src = str(Path(__file__).resolve().parents[2])
        path = env_in.get("PYTHONPATH")
        env = {**env_in, **mpirun_env(n), **stack_env(stack),
               "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else src}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise TunelabError(f"{mpirun!r} is not installed (apt-get install -y "
                               "openmpi-bin)") from None
        except subprocess.TimeoutExpired:
            raise TunelabError(f"the {stack} link probe took more than {timeout:g} s") from None
    doc = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith('{"probe": "link"'):
            doc = json.loads(line)
            break
    if proc.returncode != 0 or doc is None:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])[-300:]
        raise TunelabError(f"the {stack} link probe failed (exit {proc.returncode}): "
                           f"{tail or 'no output'}")
    results = tuple(LinkResult(r["pattern"], int(r["message_bytes"]), int(r["ranks"]),
                               tuple(float(x) for x in r["samples"])) for r in doc["results"])
    return LinkRun(stack, results, tuple(doc.get("hosts") or ()), tuple(argv))
