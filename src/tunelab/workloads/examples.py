"""``tunelab init WORKLOAD``: a commented example study for any workload.

Every built-in workload gets a study that ``tunelab space`` and ``tunelab run --dry-run``
accept as written (a test loops over ``tunelab workloads``), plus the input files it names
(the ``qe`` study's pw.x input). A third-party workload may define a classmethod
``example_study() -> str``; otherwise it gets a generic skeleton.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tunelab.workload import Workload

__all__ = ["example_files", "example_study"]

_HEADER = """\
# Edit, then:
#   tunelab space {study}             # valid points, and what each constraint excluded
#   tunelab run {study} --dry-run     # the commands it would run (runs nothing)
#   tunelab run {study}               # run it (resumable); then tunelab report runs/{name}
# Study-file reference: docs/study-files.md; this workload: docs/workloads/{workload}.md
"""

_COMMAND = """\
name: {name}
workload:
  name: command
  options:
    # argv list (never a shell string); {{name}} is replaced by parameters and derived
    # values, and a literal brace is written {{{{ or }}}}
    argv:
      - python3
      - -c
      - |
        import sys, time, zlib, random
        level = int(sys.argv[1])
        data = bytes(random.Random(0).choices(b"ACGT", k=1_000_000))
        start = time.perf_counter()
        packed = zlib.compress(data, level)
        print("seconds=%.6f ratio=%.4f" % (time.perf_counter() - start, len(data) / len(packed)))
      - "{{level}}"
    foms:                       # figures of merit: a regex with a group named 'value'
      seconds: 'seconds=(?P<value>[0-9.eE+-]+)'
      ratio: 'ratio=(?P<value>[0-9.]+)'
parameters:
  level: {{type: int, min: 1, max: 9, step: 1}}
constraints:
  - level % 2 == 1              # expressions over parameters; see docs/study-files.md
repeats: 3
baseline: {{level: 1}}
timeout: 60                     # seconds per run
objective: {{fom: seconds, direction: minimize}}
"""

_QE = """\
# Quantum ESPRESSO pw.x on bulk Si ({input}, written beside this file: 2 atoms, about half a
# second per run). The qe workload adds pw.x's rules as constraints (npool divides np, ndiag
# a square <= np/npool, npool <= the number of k-points); `tunelab space` shows what they
# excluded. np beyond the machine's cores needs `oversubscribe: true`.
name: {name}
workload:
  name: qe
  options:
    input: {input}              # the pw.x input, relative to this study file
    oversubscribe: true
parameters:
  np: [1, 2]
  npool: {{type: int, min: 1, max: 2}}
  ndiag: [1, 4]
repeats: 3
baseline: {{np: 1, npool: 1, ndiag: 1}}
timeout: 120
objective: {{fom: pwscf_wall_s, direction: minimize}}
"""

_QE_INPUT = """\
! Bulk silicon, 2 atoms (diamond, fcc lattice), LDA norm-conserving pseudopotential from
! Debian's quantum-espresso-data (apt-get install quantum-espresso-data).
&CONTROL
  calculation = 'scf'
  prefix = 'si'
  pseudo_dir = '/usr/share/espresso/pseudo'
  outdir = './tmp'
/
&SYSTEM
  ibrav = 2
  celldm(1) = 10.26
  nat = 2
  ntyp = 1
  ecutwfc = 25.0
/
&ELECTRONS
  conv_thr = 1.0d-10
/
ATOMIC_SPECIES
  Si  28.086  Si.pz-vbc.UPF
ATOMIC_POSITIONS alat
  Si 0.00 0.00 0.00
  Si 0.25 0.25 0.25
K_POINTS automatic
  4 4 4 1 1 1
"""

_MERGE = """\
# The all-to-all dataframe merge benchmark (the competition's UCX task): 2 workers exchange
# hash-partitioned chunks and merge them; bandwidth and throughput as the seed defines them.
# Each env set is one point: here the MPI transport with and without UCX's shared memory.
name: {name}
workload:
  name: merge
  options:
    transport: mpi
    workers: 2
    chunk_size: 100000
    iterations: 3
parameters: {{}}
env:                            # environment-variable sets: each one is a point
  default: {{}}
  tcp-only: {{UCX_TLS: "tcp,self"}}
repeats: 3
baseline: {{env: default}}
timeout: 120
objective: {{fom: throughput, direction: maximize}}
"""

_LEOPARD = """\
# Leopard DNA U-Net training, tuned like the seed team did: batch size, then learning rate;
# scored by validation PR-AUC. Without a `data` option a synthetic genome is generated once
# into ~/.cache/tunelab/leopard/ before the first run (`run --dry-run` generates nothing).
# Short windows and epochs keep a run under a minute on 2 CPU cores.
name: {name}
workload:
  name: leopard
  options:
    window: 2048
    epochs: 2
    steps_per_epoch: 10
    bn_momentum: 0.1
    max_eval_windows: 64
parameters:
  batch_size: [8, 16]
  lr: [0.001, 0.005]
repeats: 3
baseline: {{batch_size: 16, lr: 0.001}}
timeout: 10m
"""

_REPLAY = """\
# A replayed landscape: every point answers with one of its recorded runs (seeded), so a
# search strategy runs offline in seconds. 'tunelab replay DIR -o FILE' writes one from a
# finished study; benchmarks/landscapes/ ships some recorded on this machine. Try a
# strategy: search: {{strategy: racing}} (docs/search.md).
name: {name}
workload:
  name: replay
  options:
    fom: time_s
    direction: minimize
    seed: 0
    points:
    - {{point: {{np: 1}}, runs: [10.2, 10.5, 10.1, 10.4, 10.3]}}
    - {{point: {{np: 2}}, runs: [5.6, 5.4, 5.9, 5.5, 5.7]}}
    - {{point: {{np: 4}}, runs: [5.1, 6.3, 5.0, 5.8, 5.2]}}
parameters:
  np: [1, 2, 4]
repeats: 3
baseline: {{np: 1}}
objective: {{fom: time_s, direction: minimize}}
search: {{strategy: racing}}
"""

_TEMPLATES = {"command": _COMMAND, "qe": _QE, "merge": _MERGE, "leopard": _LEOPARD,
              "replay": _REPLAY}


def example_study(cls: type[Workload], study_name: str = "study.yaml") -> str:
    """The text of a commented example study file for workload class ``cls``, as it reads
    when written to a file named ``study_name``."""
    custom = getattr(cls, "example_study", None)
    if callable(custom):
        return str(custom())
    stem = Path(study_name).stem
    name = f"my-{cls.name}-study" if stem in ("", "study") else stem
    fields = {"study": study_name, "name": name, "workload": cls.name,
              "input": f"{stem}.in"}
    template = _TEMPLATES.get(cls.name)
    if template is not None:
        return _HEADER.format(**fields) + template.format(**fields)
    body = {
        "name": name,
        "workload": {"name": cls.name, "options": {}},
        "repeats": 3,
        "timeout": 600,
    }
    return (
        f"# A tunelab study of the {cls.name!r} workload: {cls.description}\n"
        + _HEADER.format(**fields)
        + "# Fill in the workload's options, parameters and constraints; without parameters\n"
        "# the workload's default space is used.\n"
        + yaml.safe_dump(body, sort_keys=False)
    )


def example_files(cls: type[Workload], study_path: Path) -> dict[Path, str]:
    """Every file ``tunelab init`` writes: the study at ``study_path`` and the inputs it
    names, beside it."""
    files = {study_path: example_study(cls, study_path.name)}
    if cls.name == "qe" and not callable(getattr(cls, "example_study", None)):
        files[study_path.with_name(f"{study_path.stem}.in")] = _QE_INPUT
    return files
