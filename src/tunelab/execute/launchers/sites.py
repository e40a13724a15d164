"""Site profiles: the scheduler dialects job scripts are written in, as data.

A site is a few fields that the one renderer (:mod:`tunelab.execute.launchers.script`) and
the launch lines (:mod:`tunelab.cluster.mpi`) read; no launcher code branches on a site's
name. A study picks one with ``launcher.site``; without it, ``slurm`` for ``type: slurm`` and
``pbspro`` for ``type: pbs``.

Each site below: its scheduler; the resource syntax; how a job gets into its directory; how
it asks for whole nodes (``isolation: exclusive``, the default); how MPI ranks start.

* ``slurm`` — ``--nodes``/``--ntasks-per-node``; ``cd DIR``; ``--exclusive``;
  ``srun --mpi=pmix``. ``slurm-pmi2`` and ``slurm-none``: the same with ``--mpi=pmi2`` or
  ``--mpi=none``.
* ``pbspro``, ``openpbs`` — ``select=N:ncpus=…:mpiprocs=…``; ``cd "$PBS_O_WORKDIR"``;
  ``place=excl`` (``scatter:excl`` over several nodes, so a two-node point gets two hosts);
  ``mpirun`` with the job's hostfile.
* ``gadi`` — NCI Gadi's PBS Pro: ``ncpus=`` (total cores; whole nodes' cores when
  exclusive); ``-l wd`` (Gadi's own directive); ``mpirun``.
* ``torque`` — Torque, or Slurm's PBS-compatible wrappers: ``nodes=N:ppn=…``;
  ``cd "$PBS_O_WORKDIR"``; ``-n`` (node-exclusive); ``-A`` for the account; ``mpirun``.
* ``virtual`` — tunelab's virtual cluster (``scripts/virtual-cluster.sh``): as ``slurm``,
  and waiting MPI ranks yield their core, because its nodes share this machine's cores. That
  tuning lives here only, never in a production site's scripts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["DEFAULT_SITES", "SITES", "Site", "site_for"]

Resources = Literal["slurm", "ncpus", "select", "nodes"]
Workdir = Literal["cd", "wd", "pbs_o_workdir"]


@dataclass(frozen=True)
class Site:
    """One scheduler dialect (see the module docstring's table)."""

    name: str
    scheduler: Literal["slurm", "pbs"]
    resources: Resources
    workdir: Workdir
    mpi: Literal["pmix", "pmi2", "none"] = "pmix"
    starter: Literal["srun", "mpirun"] = "srun"
    account_flag: str = "-P"
    """PBS's option naming the project or account (PBS Pro's ``-P``; Torque's ``-A``)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Exported in every job of the site (tuning that only this site needs)."""
    about: str = ""


SITES: dict[str, Site] = {s.name: s for s in (
    Site("slurm", "slurm", "slurm", "cd", about="Slurm with PMIx"),
    Site("slurm-pmi2", "slurm", "slurm", "cd", mpi="pmi2", about="Slurm with PMI-2"),
    Site("slurm-none", "slurm", "slurm", "cd", mpi="none",
         about="Slurm; the MPI library starts its ranks itself"),
    Site("pbspro", "pbs", "select", "pbs_o_workdir", starter="mpirun", about="PBS Pro"),
    Site("openpbs", "pbs", "select", "pbs_o_workdir", starter="mpirun", about="OpenPBS"),
    Site("gadi", "pbs", "ncpus", "wd", starter="mpirun", about="NCI Gadi (PBS Pro)"),
    Site("torque", "pbs", "nodes", "pbs_o_workdir", starter="mpirun", account_flag="-A",
         about="Torque, or Slurm's PBS-compatible wrappers"),
    Site("virtual", "slurm", "slurm", "cd", env={"OMPI_MCA_mpi_yield_when_idle": "1"},
         about="tunelab's virtual cluster: its nodes share this machine's cores"),
)}

DEFAULT_SITES = {"slurm": "slurm", "pbs": "pbspro"}
"""The site of a scheduler when the study names none."""


def site_for(scheduler: str, name: str | None = None) -> Site:
    """The site ``name`` (or the scheduler's default); a ``ValueError`` naming the valid
    sites when it is unknown or speaks another scheduler."""
    if name is None:
        return SITES[DEFAULT_SITES[scheduler]]
    site = SITES.get(name)
    if site is None or site.scheduler != scheduler:
        valid = ", ".join(n for n, s in SITES.items() if s.scheduler == scheduler)
        what = "unknown site" if site is None else f"site for {site.scheduler}, not {scheduler}:"
        raise ValueError(f"{what} {name!r}; valid for {scheduler}: {valid}")
    return site
