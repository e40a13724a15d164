"""Read figures of merit from pw.x output (Quantum ESPRESSO 6.x and 7.x).

:func:`parse_pw_output` turns the text pw.x writes to stdout into a flat ``dict[str, float]``:

* ``pwscf_wall_s`` / ``pwscf_cpu_s``: the final ``PWSCF : … CPU … WALL`` line;
* ``scf_iterations`` (summed over all SCF cycles of a run), ``scf_cycles``,
  ``total_energy_ry`` (the last ``!`` line), ``fermi_energy_ev`` when present (or
  ``fermi_energy_up_ev`` / ``fermi_energy_dw_ev``), ``homo_ev`` / ``lumo_ev`` for insulators,
  ``kpoints`` (the number pw.x actually used);
* the parallelisation pw.x reports: ``par_mpi_procs``, ``par_threads``, ``par_nodes``,
  ``par_pools``, ``par_rg_procs`` (R & G space division), ``par_ndiag`` (the size of the
  linear-algebra group, 1 when pw.x chose "a serial algorithm"), ``par_ntg`` (task groups),
  ``par_bgrp`` (band groups);
* every routine timer as ``timer.<routine>.wall_s``, ``timer.<routine>.cpu_s`` and
  ``timer.<routine>.calls``, including the "Called by …" sections. A name that appears a second
  time in another section is stored as ``<section>:<routine>``.

Times come in four shapes (QE's ``print_this_clock``): ``0.52s``, ``1m52.55s`` (also
``2m 5.30s``), ``1h 2m`` and ``1d 2h 3m``. An ``Error in routine X (N):`` block, or a
``CRASH`` file, raises :class:`~tunelab.errors.ParseError` with pw.x's own message.
"""

from __future__ import annotations

import re
from pathlib import Path

from tunelab.errors import ParseError, RunReportedError

__all__ = ["parse_duration", "parse_pw_output", "pw_error"]

_DURATION = re.compile(
    r"\s*(?:(?P<d>\d+)\s*d)?\s*(?:(?P<h>\d+)\s*h)?\s*(?:(?P<m>\d+)\s*m(?!s))?"
    r"\s*(?:(?P<s>\d+(?:\.\d*)?|\.\d+)\s*s)?\s*"
)
_TIMER = re.compile(
    r"^\s*(?P<name>\S+)\s*:\s*(?P<cpu>[\d.\sdhms]+?)\s*CPU\s+(?P<wall>[\d.\sdhms]+?)\s*WALL"
    r"(?:\s*\(\s*(?P<calls>\d+)\s*calls\))?\s*$",
    re.MULTILINE | re.IGNORECASE,
)
_SECTION = re.compile(r"^\s*Called by\s+(?P<name>\S+?)\s*:\s*$", re.IGNORECASE)
_ERROR = re.compile(r"Error in routine\s+(?P<routine>\S+)\s*\(\s*(?P<code>-?\d+)\s*\)")
_CRASH = re.compile(r"from\s+(?P<routine>\S+)\s*:\s*error\s*#\s*(?P<code>-?\d+)")
_TAG_MISSING = re.compile(r"^[ \t]*(\S.*\btag \S+ not found\b.*?)[ \t]*$", re.MULTILINE)
"""pw.x's pseudopotential reader on a corrupt file prints this, then dies in the Fortran
runtime without an ``Error in routine`` block (mpirun's banner is all stderr shows)."""
_ENERGY = re.compile(r"^\s*!+\s*total energy\s*=\s*(?P<e>[-+\d.EeDd]+)\s*Ry", re.MULTILINE)
_CONVERGED = re.compile(r"convergence has been achieved in\s+(\d+)\s+iterations")
_NOT_CONVERGED = re.compile(r"convergence NOT achieved after\s+(\d+)\s+iterations")
_FLOAT = r"([-+]?\d+(?:\.\d*)?(?:[EeDd][-+]?\d+)?)"
_SIMPLE: dict[str, re.Pattern[str]] = {
    "fermi_energy_ev": re.compile(r"the Fermi energy is\s+" + _FLOAT + r"\s*ev", re.IGNORECASE),
    "homo_ev": re.compile(r"highest occupied(?:, lowest unoccupied)? level \(ev\):\s+" + _FLOAT),
    "lumo_ev": re.compile(r"highest occupied, lowest unoccupied level \(ev\):\s+\S+\s+" + _FLOAT),
    "kpoints": re.compile(r"number of k points=\s*(\d+)"),
    "par_nodes": re.compile(r"MPI processes distributed on\s+(\d+)\s+nodes"),
    "par_pools": re.compile(r"K-points division:\s+npool\s*=\s*(\d+)"),
    "par_rg_procs": re.compile(r"R & G space division:\s+proc/nbgrp/npool/nimage\s*=\s*(\d+)"),
    "par_bgrp": re.compile(r"band groups division:\s+nbgrp\s*=\s*(\d+)"),
    "par_ntg": re.compile(r"#TG\s+x Z-proc\s*=\s*(\d+)"),
}
_FERMI_SPIN = re.compile(
    r"the spin up/dw Fermi energies are\s+" + _FLOAT + r"\s+" + _FLOAT, re.IGNORECASE
)
_PROCS = re.compile(r"running on\s+(\d+)\s+processors\b")
_CORES = re.compile(r"running on\s+(\d+)\s+processor cores")
_MPI_PROCS = re.compile(r"Number of MPI processes:\s+(\d+)")
_THREADS = re.compile(r"Threads/MPI process:\s+(\d+)")
_SERIAL_OMP = re.compile(r"Serial multi-threaded version, running on\s+(\d+)\s+processor cores")
_NDIAG = re.compile(r"size of sub-group:\s*(\d+)\s*\*\s*(\d+)\s*procs")


def _num(text: str) -> float:
    return float(text.replace("D", "E").replace("d", "e"))


def parse_duration(text: str) -> float:
    """Seconds in a pw.x clock value: ``0.52s``, ``1m52.55s``, ``2m 5.30s``, ``1h 2m``,
    ``1d 2h 3m``. Raises ValueError for anything else."""
    m = _DURATION.fullmatch(text)
    if m is None or not any(m.group(k) for k in "dhms"):
        raise ValueError(f"not a pw.x duration: {text!r}")
    d, h, mi = (int(m.group(k) or 0) for k in "dhm")
    s = float(m.group("s") or 0.0)
    return d * 86400.0 + h * 3600.0 + mi * 60.0 + s


def pw_error(stdout: str, run_dir: Path | None = None) -> str | None:
    """pw.x's own error as one line (``routine (N): message``), from its output or from the
    ``CRASH`` file it leaves in its working directory; None when there is none."""
    found = _error_block(stdout, _ERROR)
    if found is None and run_dir is not None:
        crash = run_dir / "CRASH"
        if crash.is_file():
            text = crash.read_text(errors="replace")
            found = _error_block(text, _CRASH)
            if found is None:
                lines = [ln.strip(" %") for ln in text.splitlines() if ln.strip(" %")]
                return "CRASH file: " + (" ".join(lines)[:300] or "(empty)")
    return found


def _error_block(text: str, head: re.Pattern[str]) -> str | None:
    """``routine (N): message`` of the first error block whose first line ``head`` matches.

    Every MPI rank that fails prints the block, and mpirun may interleave the ranks' lines
    (another rank's ``%%%%`` banner between one rank's error line and its message, seen under
    load): banners, blank lines, further error lines, ``task #`` lines and repeated message
    lines are skipped; the message ends at a banner after it or at ``stopping ...``.
    """
    m = head.search(text)
    if m is None:
        return None
    msg: list[str] = []
    for line in text[m.end():].splitlines()[1:]:  # [0] is the rest of the error line
        s = line.strip()
        if s.startswith("stopping") or (msg and s.startswith("%%%%%")):
            break
        if not s.strip("%") or head.search(s) or s.startswith("task #") or s in msg:
            continue
        msg.append(s)
    return f"{m.group('routine')} ({m.group('code')}): {' '.join(msg)}".rstrip()


def _timers(stdout: str) -> dict[str, float]:
    foms: dict[str, float] = {}
    section = ""
    seen: set[str] = set()
    for line in stdout.splitlines():
        sec = _SECTION.match(line)
        if sec:
            section = sec.group("name")
            continue
        if line.strip() in ("General routines", "Parallel routines"):
            section = line.strip().split()[0].lower()
            continue
        m = _TIMER.match(line)
        if m is None:
            continue
        name = m.group("name")
        if name.upper() == "PWSCF":
            continue
        try:
            cpu, wall = parse_duration(m.group("cpu")), parse_duration(m.group("wall"))
        except ValueError:
            continue
        key = name if name not in seen or not section else f"{section}:{name}"
        seen.add(name)
        foms[f"timer.{key}.cpu_s"] = cpu
        foms[f"timer.{key}.wall_s"] = wall
        if m.group("calls") is not None:
            foms[f"timer.{key}.calls"] = float(m.group("calls"))
    return foms


def _parallelisation(stdout: str) -> dict[str, float]:
    foms: dict[str, float] = {}
    mpi = _MPI_PROCS.search(stdout)
    procs = _PROCS.search(stdout)
    cores = _CORES.search(stdout)
    threads = _THREADS.search(stdout)
    foms["par_threads"] = float(threads.group(1)) if threads else 1.0
    serial_omp = _SERIAL_OMP.search(stdout)
    if serial_omp and not threads:  # a serial OpenMP build prints its threads as cores
        foms["par_threads"] = float(serial_omp.group(1))
    if mpi:
        foms["par_mpi_procs"] = float(mpi.group(1))
    elif "Serial version" in stdout or "Serial multi-threaded version" in stdout:
        foms["par_mpi_procs"] = 1.0
    elif procs:
        foms["par_mpi_procs"] = float(procs.group(1))
    elif cores:
        foms["par_mpi_procs"] = float(int(cores.group(1)) // int(foms["par_threads"]))
    nd = _NDIAG.search(stdout)
    if nd:
        foms["par_ndiag"] = float(int(nd.group(1)) * int(nd.group(2)))
    elif "a serial algorithm will be used" in stdout:
        foms["par_ndiag"] = 1.0
    return foms


def parse_pw_output(stdout: str, run_dir: Path | None = None) -> dict[str, float]:
    """Figures of merit of one pw.x run (see the module docstring).

    Raises :class:`ParseError` when pw.x reported an error, when the SCF did not converge,
    or when the output has no final ``PWSCF`` timing line (the run did not finish).
    """
    err = pw_error(stdout, run_dir)
    if err is not None:
        raise RunReportedError(f"pw.x stopped with Error in routine {err}")
    missing = _TAG_MISSING.search(stdout)
    if missing is not None and "JOB DONE" not in stdout:
        raise RunReportedError(f"pw.x stopped: {missing.group(1)}")
    total = None
    for m in _TIMER.finditer(stdout):
        if m.group("name").upper() == "PWSCF":
            total = m
    if total is None:
        if "Program PWSCF" not in stdout:
            raise ParseError("no pw.x output: the output has no 'Program PWSCF' banner")
        raise ParseError("pw.x output ends before the final 'PWSCF : … WALL' line")
    not_conv = _NOT_CONVERGED.search(stdout)
    if not_conv:
        raise RunReportedError(
            f"pw.x SCF did not converge after {not_conv.group(1)} iterations; "
            "its timings and energy are not comparable"
        )
    foms: dict[str, float] = {
        "pwscf_cpu_s": parse_duration(total.group("cpu")),
        "pwscf_wall_s": parse_duration(total.group("wall")),
    }
    iters = [int(x) for x in _CONVERGED.findall(stdout)]
    if iters:
        foms["scf_iterations"] = float(sum(iters))
        foms["scf_cycles"] = float(len(iters))
    energies = _ENERGY.findall(stdout)
    if energies:
        foms["total_energy_ry"] = _num(energies[-1])
    for key, pattern in _SIMPLE.items():
        found = pattern.findall(stdout)
        if found:
            foms[key] = _num(found[-1])
    spin = _FERMI_SPIN.findall(stdout)
    if spin:
        foms["fermi_energy_up_ev"], foms["fermi_energy_dw_ev"] = (_num(x) for x in spin[-1])
    foms.update(_parallelisation(stdout))
    foms.setdefault("par_pools", 1.0)
    foms.setdefault("par_ntg", 1.0)
    foms.update(_timers(stdout))
    return foms
