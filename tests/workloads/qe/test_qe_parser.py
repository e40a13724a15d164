"""pw.x output parser: real 6.7 outputs produced on this machine, hand-written 7.x excerpts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tunelab.errors import ParseError
from tunelab.workloads.qe.parser import parse_duration, parse_pw_output, pw_error

DATA = Path(__file__).parent / "data"


def _read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0.52s", 0.52),
        ("   0.00s", 0.0),
        ("1m52.55s", 112.55),
        ("58m 5.30s", 3485.30),
        ("1h 2m", 3720.0),
        (" 1h23m", 4980.0),
        ("1d   2h 3m", 93780.0),
    ],
)
def test_durations_in_every_qe_clock_format(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "1x", "s"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_real_serial_output_matches_its_text() -> None:
    text = _read("si_np1.out")
    foms = parse_pw_output(text)
    wall = re.search(r"PWSCF\s*:\s*([\d.]+)s CPU\s+([\d.]+)s WALL", text)
    assert wall is not None
    assert foms["pwscf_cpu_s"] == float(wall.group(1))
    assert foms["pwscf_wall_s"] == float(wall.group(2))
    energy = re.search(r"!\s+total energy\s+=\s+(\S+) Ry", text)
    assert energy is not None
    assert foms["total_energy_ry"] == float(energy.group(1))
    iters = re.search(r"achieved in\s+(\d+) iterations", text)
    assert iters is not None
    assert foms["scf_iterations"] == float(iters.group(1))
    assert foms["par_mpi_procs"] == 1.0
    assert foms["par_pools"] == 1.0
    assert foms["par_ndiag"] == 1.0
    assert foms["kpoints"] == 10.0
    assert "fermi_energy_ev" not in foms  # an insulator with fixed occupations
    assert foms["homo_ev"] == pytest.approx(5.7617)


def test_every_timer_line_of_a_real_output_is_parsed() -> None:
    text = _read("si_np1.out")
    foms = parse_pw_output(text)
    lines = re.findall(
        r"^\s+(\S+)\s*:\s+([\d.]+)s CPU\s+([\d.]+)s WALL \(\s*(\d+) calls\)", text, re.M
    )
    assert len(lines) > 20
    for name, cpu, wall, calls in lines:
        assert foms[f"timer.{name}.cpu_s"] == float(cpu)
        assert foms[f"timer.{name}.wall_s"] == float(wall)
        assert foms[f"timer.{name}.calls"] == float(calls)
    # "Called by" sections and the h_psi:calbec / calbec pair are kept apart.
    assert foms["timer.h_psi:calbec.calls"] != foms["timer.calbec.calls"]
    assert "timer.cdiaghg.wall_s" in foms and "timer.vloc_psi.wall_s" in foms


def test_parallelisation_actually_used_is_reported() -> None:
    pools = parse_pw_output(_read("si_np2_npool2.out"))
    assert (pools["par_mpi_procs"], pools["par_pools"], pools["par_ndiag"]) == (2.0, 2.0, 1.0)
    diag = parse_pw_output(_read("si_np4_ndiag4.out"))
    assert diag["par_ndiag"] == 4.0
    assert diag["par_rg_procs"] == 4.0
    assert "timer.fft_scatt_yz.wall_s" in diag  # "Parallel routines" section
    tg = parse_pw_output(_read("si_np2_ntg2.out"))
    assert tg["par_ntg"] == 2.0
    assert tg["par_rg_procs"] == 2.0


def test_metallic_output_has_a_fermi_energy() -> None:
    foms = parse_pw_output(_read("ceo2_np2_npool2.out"))
    assert foms["fermi_energy_ev"] == pytest.approx(10.3307)
    assert foms["total_energy_ry"] == pytest.approx(-555.24966323)
    assert foms["kpoints"] == 8.0
    assert "timer.PAW_pot.wall_s" in foms


def test_pw_error_in_output_and_crash_file(tmp_path: Path) -> None:
    text = _read("crash/si_np2_npool3.out")
    with pytest.raises(ParseError, match=r"mp_start_pools \(1\): invalid number of pools"):
        parse_pw_output(text)
    # Output lost (for example, only stderr captured): the CRASH file still tells why.
    assert pw_error("", DATA / "crash") == (
        "mp_start_pools (1): invalid number of pools, out of range"
    )
    with pytest.raises(ParseError, match="invalid number of pools"):
        parse_pw_output("", DATA / "crash")
    assert pw_error("", tmp_path) is None


_BANNER = " " + "%" * 78


@pytest.mark.parametrize("lines", [
    # another rank's banner between one rank's error line and its message (seen in CI)
    [_BANNER, "     Error in routine mp_start_pools (1):", _BANNER,
     "     Error in routine mp_start_pools (1):", "     invalid number of pools, out of range",
     "     invalid number of pools, out of range", _BANNER, _BANNER, "", "     stopping ...",
     "     stopping ..."],
    # both error lines first, then both messages
    [_BANNER, _BANNER, "     Error in routine mp_start_pools (1):",
     "     Error in routine mp_start_pools (1):", "     invalid number of pools, out of range",
     _BANNER, "     invalid number of pools, out of range", _BANNER],
])
def test_pw_error_of_interleaved_ranks(lines: list[str]) -> None:
    """Each failing MPI rank prints the error block; mpirun may interleave their lines."""
    assert pw_error("\n".join(lines) + "\n") == (
        "mp_start_pools (1): invalid number of pools, out of range")


def test_unfinished_or_foreign_output_is_a_parse_error() -> None:
    text = _read("si_np1.out")
    cut = text[: text.index("PWSCF        :")]
    with pytest.raises(ParseError, match="ends before the final"):
        parse_pw_output(cut)
    with pytest.raises(ParseError, match="no pw.x output"):
        parse_pw_output("hello world\n")


def test_unconverged_scf_is_a_parse_error() -> None:
    text = _read("si_np1.out").replace(
        "convergence has been achieved in   7 iterations",
        "convergence NOT achieved after 100 iterations: stopping",
    )
    with pytest.raises(ParseError, match="did not converge after 100"):
        parse_pw_output(text)


def test_qe7_excerpt_hybrid_parallelisation_and_long_times() -> None:
    foms = parse_pw_output(_read("qe72_ceo2_excerpt.out"))
    assert foms["pwscf_cpu_s"] == pytest.approx(57 * 60 + 32.58)
    assert foms["pwscf_wall_s"] == pytest.approx(58 * 60 + 5.30)
    assert foms["par_mpi_procs"] == 40.0
    assert foms["par_threads"] == 2.0
    assert foms["par_pools"] == 10.0
    assert foms["par_rg_procs"] == 4.0
    assert foms["par_ndiag"] == 4.0
    assert foms["par_ntg"] == 2.0
    assert foms["kpoints"] == 40.0
    assert foms["fermi_energy_ev"] == pytest.approx(10.3305)
    assert foms["total_energy_ry"] == pytest.approx(-1665.12345678)
    assert foms["scf_iterations"] == 14.0
    assert foms["timer.electrons.wall_s"] == pytest.approx(3500.12)
    assert foms["timer.fftw.calls"] == 123456.0
    assert foms["timer.sum_band:loo.wall_s"] == pytest.approx(255.0)
    assert foms["timer.init_us_2:cp.calls"] == 522.0
    # A routine listed again in another "Called by" section keeps both values.
    assert foms["timer.init_us_2.calls"] == 522.0
    assert foms["timer.sum_band:init_us_2.calls"] == 240.0
    assert foms["timer.PAW_pot.wall_s"] == pytest.approx(20.5)


@pytest.mark.parametrize(
    ("line", "cpu", "wall"),
    [
        ("     PWSCF        :      0.23s CPU      0.64s WALL", 0.23, 0.64),
        ("     PWSCF        :    1m52.55s CPU    1m58.50s WALL", 112.55, 118.5),
        ("     PWSCF        :      1h 2m CPU         1h 5m WALL", 3720.0, 3900.0),
        ("     PWSCF        :      1d   2h 3m CPU      1d   2h 9m WALL", 93780.0, 94140.0),
    ],
)
def test_qe7_total_time_line_formats(line: str, cpu: float, wall: float) -> None:
    text = (
        "     Program PWSCF v.7.3.1 starts on  1Jan2024 at  1: 2: 3\n"
        "     Serial multi-threaded version, running on    8 processor cores\n"
        "     Threads/MPI process:                     8\n"
        f"{line}\n"
    )
    foms = parse_pw_output(text)
    assert foms["pwscf_cpu_s"] == pytest.approx(cpu)
    assert foms["pwscf_wall_s"] == pytest.approx(wall)
    assert foms["par_mpi_procs"] == 1.0
    assert foms["par_threads"] == 8.0


def test_a_serial_openmp_build_reports_its_threads_as_cores() -> None:
    """QE's serial OpenMP build prints only 'Serial multi-threaded version, running on N
    processor cores': its threads read as 1, so omp=N looked ignored by pw.x."""
    text = ("     Program PWSCF v.6.7MaX starts on  1Jan2024 at  1: 2: 3\n"
            "     Serial multi-threaded version, running on    4 processor cores\n"
            "     PWSCF        :      0.23s CPU      0.64s WALL\n")
    foms = parse_pw_output(text)
    assert (foms["par_mpi_procs"], foms["par_threads"]) == (1.0, 4.0)


def test_qe7_error_excerpt() -> None:
    with pytest.raises(ParseError) as err:
        parse_pw_output(_read("qe71_error_excerpt.out"))
    assert str(err.value) == (
        "pw.x stopped with Error in routine cdiaghg (12): S matrix not positive definite"
    )


def test_spin_polarised_fermi_energies() -> None:
    text = _read("si_np1.out").replace(
        "     highest occupied level (ev):     5.7617",
        "     the spin up/dw Fermi energies are     6.1000    5.9000 ev",
    )
    foms = parse_pw_output(text)
    assert foms["fermi_energy_up_ev"] == pytest.approx(6.1)
    assert foms["fermi_energy_dw_ev"] == pytest.approx(5.9)
