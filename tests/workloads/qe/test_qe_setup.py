"""What the qe workload works out before any run: pseudopotentials, tolerance, workflow
checks, and the k-point count with its source — identically for space, run and --dry-run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tunelab.errors import WorkloadError
from tunelab.workloads.qe import QEOptions, QEWorkload
from tunelab.workloads.qe.pseudo_search import search_places

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CORPUS = Path(__file__).parent / "corpus"
needs_pw = pytest.mark.skipif(
    shutil.which("pw.x") is None or shutil.which("mpirun") is None,
    reason="pw.x (quantum-espresso) and mpirun (openmpi-bin) are needed",
)

SI = """\
&control
  calculation = '{calc}', prefix = '{prefix}' {control}
/
&system
  ibrav = 2, celldm(1) = 10.26, nat = 2, ntyp = 1, ecutwfc = 12.0 {system}
/
&electrons
  {electrons}
/
ATOMIC_SPECIES
Si 28.086 {pseudo}
ATOMIC_POSITIONS alat
Si 0.00 0.00 0.00
Si 0.25 0.25 0.25
K_POINTS automatic
2 2 2 0 0 0
"""


def _input(tmp_path: Path, name: str = "si.in", *, calc: str = "scf", prefix: str = "si",
           control: str = "", system: str = "", electrons: str = "",
           pseudo: str = "Si.pz-vbc.UPF") -> Path:
    path = tmp_path / name
    path.write_text(SI.format(calc=calc, prefix=prefix, control=control, system=system,
                              electrons=electrons, pseudo=pseudo))
    return path


def _workload(tmp_path: Path, dry_run: bool = True, **options: Any) -> QEWorkload:
    options.setdefault("input", "si.in")
    wl = QEWorkload(QEOptions(**options), tmp_path / "study.yaml")
    wl.dry_run = dry_run
    return wl


def _cli(*args: str | Path, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunelab", *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _refused_alike(study: Path, run_dir: Path) -> set[str]:
    """The one error line ``space``, ``run --dry-run`` and ``run`` each give for ``study``
    (each exits 2): a set of one when they agree."""
    results = [_cli("space", study), _cli("run", study, "--dry-run"),
               _cli("run", study, "--dir", run_dir)]
    assert [r.returncode for r in results] == [2, 2, 2]
    return {r.stderr.strip() for r in results}


# -- pseudopotentials ------------------------------------------------------------------


def test_pseudopotentials_are_searched_in_the_documented_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs = {k: tmp_path / k for k in ("input", "option", "env", "home")}
    for d in dirs.values():
        d.mkdir()
        (d / "X.UPF").write_text(d.name)
    (dirs["home"] / "espresso" / "pseudo").mkdir(parents=True)
    (dirs["home"] / "espresso" / "pseudo" / "X.UPF").write_text("home")
    monkeypatch.setenv("HOME", str(dirs["home"]))
    monkeypatch.setenv("ESPRESSO_PSEUDO", str(dirs["env"]))
    _input(tmp_path, control=", pseudo_dir = 'input'", pseudo="X.UPF")

    def found() -> str:
        wl = _workload(tmp_path, pseudo_dir="option", nk=1)
        return wl.setup.pseudos.files["X.UPF"].read_text()

    assert found() == "input"  # the input's own pseudo_dir first (relative to the input)
    (dirs["input"] / "X.UPF").unlink()
    assert found() == "option"
    (dirs["option"] / "X.UPF").unlink()
    with pytest.raises(WorkloadError, match="searched only for an input that names no "
                       "pseudo_dir"):  # as pw.x: its defaults replaced by the input's
        found()
    (dirs["option"] / "X.UPF").write_text("option")
    _input(tmp_path, pseudo="X.UPF")  # names no pseudo_dir: pw.x's defaults after the option
    for gone, expected in (("input", "option"), ("option", "env"), ("env", "home")):
        (dirs[gone] / "X.UPF").unlink(missing_ok=True)
        assert found() == expected
    places = [p.label for p in search_places(None, None)]
    assert places == ["the input's pseudo_dir", "the option pseudo_dir", "$ESPRESSO_PSEUDO",
                      "~/espresso/pseudo", "/usr/share/espresso/pseudo"]


def test_debian_directory_is_searched_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    if not Path("/usr/share/espresso/pseudo/Si.pz-vbc.UPF").is_file():
        pytest.skip("needs Debian's quantum-espresso-data")
    monkeypatch.delenv("ESPRESSO_PSEUDO", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    _input(tmp_path)  # names no pseudo_dir at all
    files = _workload(tmp_path, nk=1).setup.pseudos.files
    assert files["Si.pz-vbc.UPF"] == Path("/usr/share/espresso/pseudo/Si.pz-vbc.UPF")


def test_missing_pseudopotential_names_every_place_in_space_run_and_dry_run(
    tmp_path: Path
) -> None:
    _input(tmp_path, pseudo="Si.nowhere.UPF")
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nworkload: {name: qe, options: {input: si.in, nk: 2}}\n"
                     "parameters: {np: [1]}\n")
    env = {"ESPRESSO_PSEUDO": str(tmp_path / "env")}
    results = [_cli("space", study, env=env), _cli("run", study, "--dry-run", env=env),
               _cli("run", study, "--dir", tmp_path / "d", env=env)]
    messages = {r.stderr.strip() for r in results}
    assert [r.returncode for r in results] == [2, 2, 2] and len(messages) == 1
    (message,) = messages
    assert message.count("\n") == 0 and "Traceback" not in message
    assert "'Si.nowhere.UPF' of species 'Si'" in message
    for place in ("the input's pseudo_dir (not set)", "the option pseudo_dir "
                  "(not set)", f"$ESPRESSO_PSEUDO ({tmp_path / 'env'})", "~/espresso/pseudo (",
                  "/usr/share/espresso/pseudo"):
        assert place in message
    assert not (tmp_path / "d").exists()


def test_a_pseudo_dir_that_is_not_a_directory_is_refused_alike_everywhere(
    tmp_path: Path
) -> None:
    """A relative pseudo_dir written for the directory pw.x is started in (here the study's)
    is not found from the input file's directory, where tunelab takes it; tunelab then took
    Debian's file of the same name without a word, so every run computed with another
    pseudopotential than the team's (checked with real runs: -15.8355 Ry instead of the
    team's -15.7291 Ry)."""
    (tmp_path / "pp").mkdir()  # beside the study: where the team starts pw.x
    (tmp_path / "pp" / "Si.pz-vbc.UPF").write_text("the team's own\n")
    (tmp_path / "inputs").mkdir()
    _input(tmp_path / "inputs", control=",\n  pseudo_dir = './pp'")
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nworkload: {name: qe, options: {input: inputs/si.in, nk: 2}}\n"
                     "parameters: {np: [1]}\n")
    assert _refused_alike(study, tmp_path / "d") == {
        f"tunelab: error: {study}:2: {tmp_path / 'inputs' / 'si.in'}:3: pseudo_dir './pp' "
        f"is not a directory ({tmp_path / 'inputs' / 'pp'}: tunelab takes a relative "
        "pseudo_dir from the input file's directory, not from the directory a run starts "
        "in); name the directory that holds the pseudopotentials (absolute, or relative to "
        "the input file), or leave pseudo_dir out to search the option pseudo_dir and pw.x's "
        "defaults"}
    assert not (tmp_path / "d").exists()


def test_a_file_missing_from_the_input_pseudo_dir_is_not_taken_from_debian(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pw.x reads only the pseudo_dir an input names; tunelab went on to Debian's
    directory, so a file the team's directory lacks was replaced by Debian's silently."""
    if not Path("/usr/share/espresso/pseudo/Si.pz-vbc.UPF").is_file():
        pytest.skip("needs Debian's quantum-espresso-data")
    monkeypatch.delenv("ESPRESSO_PSEUDO", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "pp").mkdir()
    _input(tmp_path, control=", pseudo_dir = 'pp'")
    with pytest.raises(WorkloadError) as caught:
        _ = _workload(tmp_path, nk=1).setup
    assert ("is in none of the places searched, in order: the input's pseudo_dir "
            f"({tmp_path / 'pp'}); the option pseudo_dir (not set) (pw.x's defaults"
            ) in str(caught.value)


UPF = '<UPF version="2.0.1">\n  <PP_INFO>\n  </PP_INFO>\n  <PP_MESH>\n' + "  0.1 0.2\n" * 400


@pytest.mark.parametrize(("text", "why"), [
    (UPF, "is cut short: a UPF file ends with </UPF>, this one stops after 4,059 bytes"),
    ("", "is empty"),
])
def test_a_cut_short_pseudopotential_is_refused_alike_everywhere(tmp_path: Path, text: str,
                                                                 why: str) -> None:
    """A UPF copied or downloaded only in part made every run die in pw.x's reader with
    'Fortran runtime error: End of file', naming no file."""
    (tmp_path / "pp").mkdir()
    (tmp_path / "pp" / "Si.team.UPF").write_text(text)
    _input(tmp_path, control=", pseudo_dir = 'pp'", pseudo="Si.team.UPF")
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nworkload: {name: qe, options: {input: si.in, nk: 2}}\n"
                     "parameters: {np: [1]}\n")
    assert _refused_alike(study, tmp_path / "d") == {
        f"tunelab: error: {study}:2: pseudopotential 'Si.team.UPF' of species 'Si' "
        f"({tmp_path / 'pp' / 'Si.team.UPF'}) {why}: pw.x would die reading it ('Fortran "
        "runtime error: End of file'); copy or download it again"}
    (tmp_path / "pp" / "Si.team.UPF").write_text(UPF + "  </PP_MESH>\n</UPF>\n")
    assert _cli("space", study).returncode == 0


def test_generated_pseudopotential_is_not_generated_by_a_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNELAB_PSEUDO_DIR", str(tmp_path / "gen"))
    wl = QEWorkload(QEOptions(input="qe/ceo2.in"), EXAMPLES / "qe-ceo2.yaml")
    wl.dry_run = True
    assert wl.setup.pseudos.generated == ("Ce.pbe-spdn4fc-kjpaw_tunelab.UPF",)
    assert any("generated by ld1.x when the study runs" in f for f in wl.facts())
    assert wl.nk == 8  # counted by the rules: CeO2 fluorite, 4x4x4 shifted grid
    assert not (tmp_path / "gen").exists()


# -- the energy tolerance --------------------------------------------------------------


@pytest.mark.parametrize(
    ("electrons", "system", "option", "value", "why"),
    [
        ("", "", None, 1e-5, "10 × conv_thr 1e-06"),                   # pw.x's default
        ("conv_thr = 1.0d-8", "", None, 1e-7, "10 × conv_thr 1e-08"),
        ("conv_thr = 1.0d-12", "", None, 5e-8, "below what pw.x prints"),
        ("conv_thr = 1.0d-8", ", input_dft = 'pbe0'", None, 1e-4, "hybrid"),
        ("conv_thr = 1.0d-8", ", input_dft = 'B3LYP'", None, 1e-4, "hybrid"),
        ("conv_thr = 1.0d-3", ", input_dft = 'pbe0'", None, 1e-2, "10 × conv_thr"),
        ("conv_thr = 1.0d-8", "", 3e-6, 3e-6, "option energy_tolerance"),
    ],
)
def test_energy_tolerance_follows_the_input(tmp_path: Path, electrons: str, system: str,
                                            option: float | None, value: float, why: str
                                            ) -> None:
    _input(tmp_path, electrons=electrons, system=system)
    wl = _workload(tmp_path, nk=1, energy_tolerance=option)
    assert wl.invariants() == {"total_energy_ry": pytest.approx(value)}
    assert why in wl.setup.tolerance.source
    assert any(line.startswith(f"energy tolerance: {value:g} Ry") for line in wl.facts())


# -- inputs that read an earlier run ---------------------------------------------------


def test_restart_without_its_data_is_refused_in_one_line(tmp_path: Path) -> None:
    _input(tmp_path, calc="md", control=", restart_mode = 'restart'")
    with pytest.raises(WorkloadError, match=r"restart_mode='restart' reads the data of an "
                       r"earlier run \(si.save in outdir\).*prepare.*seed"):
        _workload(tmp_path).setup  # noqa: B018
    _input(tmp_path, calc="nscf")
    with pytest.raises(WorkloadError, match="calculation='nscf' reads the data"):
        _workload(tmp_path).setup  # noqa: B018


def test_preparation_must_write_the_prefix_the_input_reads(tmp_path: Path) -> None:
    _input(tmp_path, calc="nscf")
    _input(tmp_path, "scf.in", prefix="other")
    with pytest.raises(WorkloadError, match="reads prefix 'si'.*write prefix 'other'"):
        _workload(tmp_path, prepare=[{"input": "scf.in"}]).setup  # noqa: B018
    _input(tmp_path, "scf.in")
    wl = _workload(tmp_path, prepare=[{"input": "scf.in"}])
    assert "prepared before the runs, not timed: scf.in (np 1, once per study)" in wl.facts()
    assert "pw.x counts them once the preparation ran, at the first run" in wl.setup.nk.source


def test_seed_files_must_exist(tmp_path: Path) -> None:
    _input(tmp_path, calc="md", control=", restart_mode = 'restart'")
    with pytest.raises(WorkloadError, match="seed .*nope.save.* does not exist"):
        _workload(tmp_path, seed=["nope.save"]).setup  # noqa: B018
    (tmp_path / "si.save").mkdir()
    assert _workload(tmp_path, seed=["si.save"]).setup.seeds == (tmp_path / "si.save",)


def test_options_bound_the_workflow_lists() -> None:
    with pytest.raises(ValueError, match="at most 16"):
        QEOptions(input="x.in", prepare=[{"input": "a.in"}] * 17)
    with pytest.raises(ValueError, match="extra"):
        QEOptions(input="x.in", prepare=[{"input": "a.in", "nodes": 2}])


# -- the k-point count and where it comes from -----------------------------------------


def test_space_accepts_six_pools_for_three_lsda_kpoints(tmp_path: Path) -> None:
    res = _cli("space", EXAMPLES / "qe-fe-lsda.yaml", "--show", "50",
               env={"XDG_CACHE_HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    points = json.loads(_cli("space", EXAMPLES / "qe-fe-lsda.yaml", "--show", "50", "--format",
                             "json", env={"XDG_CACHE_HOME": str(tmp_path)}).stdout)["points"]
    assert {"np": 6, "npool": 6} in points
    assert "qe: k-points (nk): 6, 3 per spin × 2 spins (LSDA), computed with pw.x 6.7's " \
           "symmetry rules" in res.stdout
    assert "an estimate: pw.x was not run" in res.stdout
    assert "qe: energy tolerance: 1e-06 Ry (10 × conv_thr 1e-07)" in res.stdout
    assert not (tmp_path / "tunelab").exists()  # space starts no pw.x


@pytest.mark.slow
@needs_pw
def test_a_real_run_asks_pw_once_and_dry_runs_reuse_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    shutil.copy(CORPUS / "fe-lsda.in", tmp_path / "si.in")
    dry = _workload(tmp_path, dry_run=True)
    assert dry.nk == 6 and "an estimate" in dry.setup.nk.source
    assert not (tmp_path / "tunelab").exists()
    real = _workload(tmp_path, dry_run=False)
    assert real.nk == 6
    assert real.setup.nk.source.startswith("3 per spin × 2 spins (LSDA), counted by pw.x 6.")
    assert len(list((tmp_path / "tunelab" / "qe-kpoints").glob("*.json"))) == 1
    again = _workload(tmp_path, dry_run=True)
    assert again.setup.nk.source == real.setup.nk.source  # from the cache, pw.x not run


def test_dry_run_of_a_workflow_runs_nothing_and_says_what_it_would_prepare(tmp_path: Path
                                                                           ) -> None:
    d = tmp_path / "d"
    res = _cli("run", EXAMPLES / "qe-nscf.yaml", "--dry-run", "--dir", d,
               env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr
    assert "-inp pw.in" in res.stdout and "(dry run: nothing was run)" in res.stderr
    assert "qe: prepared before the runs, not timed: si-scf.in (np 1, once per study)" in \
        res.stderr
    assert "qe: k-points (nk): 16," in res.stderr and "an estimate" in res.stderr
    assert not d.exists() and not (tmp_path / "cache").exists()
