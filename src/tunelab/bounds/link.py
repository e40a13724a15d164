"""Link limits between ranks, through the stack a workload uses.

:func:`link_rates` starts a link probe with a stack: ``mpi-ob1`` (Open MPI's own
point-to-point layer) or ``mpi-ucx`` (the UCX PML, selected with ``OMPI_MCA_pml=ucx
OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any`` as the merge benchmark selects it, so
``UCX_*`` variables in the environment apply to both) run :mod:`tunelab.bounds.linkprobe`
under ``mpirun``; in a batch allocation of several nodes (or with a hostfile) the ranks go one
per node, so the limit is the network's. ``tcp`` (the merge's socket transport) runs
:mod:`tunelab.bounds.tcpprobe`, one process per rank on this machine.
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

LINK_STACKS = ("mpi-ob1", "mpi-ucx", "tcp")


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
    """The Open MPI variables that select ``stack``'s point-to-point layer (none for tcp)."""
    if stack == "mpi-ob1":
        return {"OMPI_MCA_pml": "ob1"}
    if stack == "mpi-ucx":
        return {"OMPI_MCA_pml": "ucx", "OMPI_MCA_pml_ucx_tls": "any",
                "OMPI_MCA_pml_ucx_devices": "any"}
    if stack == "tcp":
        return {}
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
    probe = ["--patterns", ",".join(patterns), "--sizes", ",".join(map(str, sizes)),
             "--repeats", str(repeats), "--block-bytes", str(block_bytes)]
    if stack == "tcp":
        return _tcp_rates(ranks or 2, probe, python or sys.executable, timeout, env_in)
    with tempfile.TemporaryDirectory(prefix="tunelab-link-") as tmp:
        n, extra = _placement(ranks, hostfile, Path(tmp), env_in)
        if n < 2:
            raise TunelabError(f"a link bound needs at least 2 ranks, got {n}")
        argv = [*mpirun_argv(n, mpirun=mpirun, extra_args=extra),
                python or sys.executable, "-m", "tunelab.bounds.linkprobe", *probe]
        env = {**_with_src(env_in), **mpirun_env(n), **stack_env(stack)}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise TunelabError(f"{mpirun!r} is not installed (apt-get install -y "
                               "openmpi-bin)") from None
        except subprocess.TimeoutExpired:
            raise TunelabError(f"the {stack} link probe took more than {timeout:g} s") from None
    return _result(stack, proc.returncode, proc.stdout, proc.stderr, argv)


def _with_src(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with this tunelab's source first on PYTHONPATH (the probes import it)."""
    src = str(Path(__file__).resolve().parents[2])
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": f"{src}{os.pathsep}{path}" if path else src}


def _result(stack: str, rc: int, stdout: str, stderr: str, argv: Sequence[str]) -> LinkRun:
    """The probe's JSON line as a :class:`LinkRun`, or a one-line error with its output."""
    doc = None
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"probe": "link"'):
            doc = json.loads(line)
            break
    if rc != 0 or doc is None:
        tail = " ".join((stderr or stdout).strip().splitlines()[-3:])[-300:]
        raise TunelabError(f"the {stack} link probe failed (exit {rc}): {tail or 'no output'}")
    results = tuple(LinkResult(r["pattern"], int(r["message_bytes"]), int(r["ranks"]),
                               tuple(float(x) for x in r["samples"])) for r in doc["results"])
    return LinkRun(stack, results, tuple(doc.get("hosts") or ()), tuple(argv))


def _tcp_rates(ranks: int, probe: list[str], python: str, timeout: float,
               environ: Mapping[str, str]) -> LinkRun:
    """One :mod:`tunelab.bounds.tcpprobe` process per rank on this machine."""
    env = _with_src(environ)
    with tempfile.TemporaryDirectory(prefix="tunelab-tcp-") as tmp:
        argvs = [[python, "-m", "tunelab.bounds.tcpprobe", "--rank", str(r), "--ranks",
                  str(ranks), "--dir", tmp, "--timeout", str(min(timeout, 120.0)), *probe]
                 for r in range(ranks)]
        procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL, text=True, env=env)
                 for a in argvs]
        outs: list[tuple[str, str]] = []
        try:
            for proc in procs:
                outs.append(proc.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            raise TunelabError(f"the tcp link probe took more than {timeout:g} s") from None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    bad = next((i for i, p in enumerate(procs) if p.returncode), 0)
    return _result("tcp", procs[bad].returncode, outs[0][0], outs[bad][1], argvs[0])
