"""What each PBS flavour accepts in the ``#PBS`` lines tunelab writes, as a checker.

No PBS server is packaged for Debian, so the PBS site profiles are checked against the
directive grammar of each flavour's documentation instead of a real ``qsub``:

* PBS Pro / OpenPBS — chunks ``-l select=N:ncpus=…:mpiprocs=…:ompthreads=…``, placement
  ``-l place=ARRANGEMENT[:SHARING]`` (``free``/``pack``/``scatter``/``vscatter``;
  ``excl``/``shared``/``exclhost``); no ``-l wd`` (Gadi's own), no Torque ``nodes=``, no
  job-wide ``ncpus`` beside ``select``; the job starts in the home directory, so the body
  must ``cd`` into ``$PBS_O_WORKDIR`` (or an absolute directory).
* NCI Gadi — job-wide ``-l ncpus=`` (over one node: whole nodes, a multiple of the node's
  cores), ``-l mem``, ``-l jobfs``, ``-l storage``, ``-l software``, ``-l wd``; no
  ``select``/``place``/``nodes``.
* Torque — ``-l nodes=N:ppn=M``, ``-l walltime``, ``-l mem``, ``-n`` (node-exclusive), ``-A``
  for the account (its ``-P`` is a proxy user); no ``select``/``place``/``wd``.
"""

from __future__ import annotations

import re

_PLACE = re.compile(r"(free|pack|scatter|vscatter)?(:?(excl|shared|exclhost))?")
_CHUNK = re.compile(r"\d+(:(ncpus|mpiprocs|ompthreads|mem|ngpus)=[\w.]+)+")
_ALLOWED = {
    "pbspro": {"walltime", "select", "place", "mem"},
    "openpbs": {"walltime", "select", "place", "mem"},
    "gadi": {"walltime", "ncpus", "mem", "jobfs", "storage", "software", "wd", "ngpus"},
    "torque": {"walltime", "nodes", "mem", "pmem"},
}


def pbs_problems(script: str, flavour: str, *, cores_per_node: int | None = None) -> list[str]:
    """What ``flavour``'s ``qsub`` would refuse or get wrong in ``script`` (empty: none)."""
    problems = []
    directives = [ln[len("#PBS "):].strip() for ln in script.splitlines()
                  if ln.startswith("#PBS ")]
    resources: dict[str, str] = {}
    for d in directives:
        if d.startswith("-l "):
            for item in d[3:].split(","):
                name, _, value = item.partition("=")
                resources[name] = value
                if name not in _ALLOWED[flavour]:
                    problems.append(f"-l {name} is not a {flavour} resource")
        elif d == "-n" and flavour != "torque":
            problems.append(f"-n is not a {flavour} option")
        elif d.startswith("-P ") and flavour == "torque":
            problems.append("-P is Torque's proxy user, not an account (-A)")
        elif d.startswith("-A ") and flavour != "torque":
            problems.append(f"{flavour} names the project with -P, not -A")
    if flavour in ("pbspro", "openpbs"):
        if "select" not in resources:
            problems.append("no select chunk")
        elif not _CHUNK.fullmatch(resources["select"]):
            problems.append(f"bad select {resources['select']!r}")
        if "place" in resources and not _PLACE.fullmatch(resources["place"]):
            problems.append(f"bad place {resources['place']!r}")
    if flavour == "gadi":
        ncpus = int(resources.get("ncpus", "0"))
        if cores_per_node and ncpus > cores_per_node and ncpus % cores_per_node:
            problems.append(f"ncpus={ncpus} over one node is not whole nodes of "
                            f"{cores_per_node}")
    if flavour == "torque" and not re.fullmatch(r"\d+:ppn=\d+", resources.get("nodes", "")):
        problems.append(f"bad nodes {resources.get('nodes')!r}")
    body = script.split("\n\n", 1)[-1]
    if flavour != "gadi" and "cd " not in body:
        problems.append("the job never leaves the home directory it starts in")
    return problems
