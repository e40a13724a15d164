"""Reading pw.x inputs and staging a private copy per run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tunelab.errors import WorkloadError
from tunelab.workloads.qe.pseudo_search import resolve_pseudos
from tunelab.workloads.qe.pwcount import count_with_pw
from tunelab.workloads.qe.pwinput import read_pw_input, rewrite_control, stage_input

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
needs_pw = pytest.mark.skipif(
    shutil.which("pw.x") is None or shutil.which("mpirun") is None,
    reason="pw.x (quantum-espresso) and mpirun (openmpi-bin) are needed",
)

SI = EXAMPLES / "qe" / "si.in"


def _write(tmp_path: Path, text: str, name: str = "x.in") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


BASE = """\
&control
  calculation='scf', pseudo_dir = "{pd}" ! a comment, with = signs
  outdir='./scratch', prefix='t'
/
&system
  ibrav=2, celldm(1)=10.2, nat=2, ntyp=1, ecutwfc=20 {extra}
/
&electrons
/
ATOMIC_SPECIES
 Si 28.086 Si.pz-vbc.UPF
ATOMIC_POSITIONS {{alat}}
 Si 0.00 0.00 0.00
 Si 0.25 0.25 0.25
{kcard}
"""


@pytest.mark.parametrize(
    ("kcard", "mode", "count", "bound"),
    [
        ("K_POINTS {automatic}\n 4 4 4 1 1 1", "automatic", 64, 64),
        ("K_POINTS automatic\n 2 3 1 0 0 0", "automatic", 6, 6),
        ("K_POINTS gamma", "gamma", 1, 1),
        ("", "gamma", 1, 1),
        # a list may gain the images of its points (48 at most each) in an scf run
        ("K_POINTS tpiba\n 3\n 0 0 0 1\n 0.5 0.5 0.5 2\n 1 0 0 3", "tpiba", 3, 144),
        ("K_POINTS\n 2\n 0 0 0 1\n 0.5 0.5 0.5 1", "tpiba", 2, 96),
        ("K_POINTS crystal\n 2\n 0 0 0 1\n 0.5 0.5 0.5 1", "crystal", 2, 96),
        ("K_POINTS crystal_b\n 3\n 0 0 0 20\n 0.5 0 0 10\n 0.5 0.5 0 1", "crystal_b", 31,
         31 * 48),
        # a plane: w2 x w3 points (pw.x 6.7 printed 16 for this card, 15 for 3 and 5)
        ("K_POINTS tpiba_c\n 3\n 0 0 0 1\n 0.5 0 0 4\n 0 0.5 0 4", "tpiba_c", 16, 16 * 48),
    ],
)
def test_kpoints_from_automatic_grids_and_explicit_lists(
    tmp_path: Path, kcard: str, mode: str, count: int, bound: int
) -> None:
    path = _write(tmp_path, BASE.format(pd="/usr/share/espresso/pseudo", extra="", kcard=kcard))
    inp = read_pw_input(path)
    assert inp.kpoints.mode == mode
    assert inp.kpoints.count == count
    assert inp.nk_bound == bound


def test_nk_bound_of_a_bands_run_and_of_berry_strings(tmp_path: Path) -> None:
    """A bands run takes its list as it is; Berry-phase strings have nppstr points each,
    more than the grid when the grid has 1 point along the strings."""
    bands = BASE.format(pd="/p", extra="", kcard="K_POINTS tpiba_c\n 3\n 0 0 0 1\n"
                        " 0.5 0 0 3\n 0 0.5 0 5").replace("'scf'", "'bands'")
    assert read_pw_input(_write(tmp_path, bands, "b.in")).nk_bound == 15
    berry = BASE.format(pd="/p", extra="", kcard="K_POINTS automatic\n 3 3 1 0 0 0").replace(
        "prefix", "lberry=.true., gdir=3, nppstr=5, prefix")
    assert read_pw_input(_write(tmp_path, berry, "berry.in")).nk_bound == 45


def test_spin_polarised_input_doubles_the_kpoints(tmp_path: Path) -> None:
    text = BASE.format(pd="/p", extra=", nspin=2", kcard="K_POINTS gamma")
    inp = read_pw_input(_write(tmp_path, text))
    assert inp.nspin == 2
    assert inp.nk_bound == 2


def test_a_relative_pseudo_dir_is_shown_as_the_folder_it_names(tmp_path: Path) -> None:
    """'../pp' from inputs/ is the folder pp itself, not 'inputs/../pp' (as `space` and
    every message printed it); a symlink loop on the way ends as a path, not an error."""
    (tmp_path / "inputs").mkdir()
    text = BASE.format(pd="../pp", extra="", kcard="K_POINTS gamma")
    inp = read_pw_input(_write(tmp_path / "inputs", text))
    assert inp.pseudo_dir == (tmp_path / "pp").resolve()
    assert ".." not in inp.pseudo_dir.parts
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    looped = BASE.format(pd="../loop/pp", extra="", kcard="K_POINTS gamma")
    assert read_pw_input(_write(tmp_path / "inputs", looped, "l.in")).pseudo_dir is not None


def test_species_and_pseudo_dir(tmp_path: Path) -> None:
    text = BASE.format(pd="pp", extra="", kcard="K_POINTS gamma")
    inp = read_pw_input(_write(tmp_path, text))
    assert [(s.label, s.mass, s.pseudo) for s in inp.species] == [
        ("Si", 28.086, "Si.pz-vbc.UPF")
    ]
    assert inp.pseudo_dir == (tmp_path / "pp").resolve()  # relative to the input's directory
    no_dir = read_pw_input(_write(tmp_path, text.replace('pseudo_dir = "pp"', ""), "y.in"))
    assert no_dir.pseudo_dir is None


def test_facts_read_from_the_namelists(tmp_path: Path) -> None:
    text = BASE.format(pd="/p", extra=", nspin=2", kcard="K_POINTS gamma")
    inp = read_pw_input(_write(tmp_path, text.replace("&electrons", "&electrons\n conv_thr=2.d-9")))
    assert (inp.prefix, inp.calculation, inp.conv_thr, inp.lsda) == ("t", "scf", 2e-9, True)
    assert inp.reads_previous_run is None
    for change, why in (("calculation='scf'", None), ("calculation='nscf'", "calculation='nscf'"),
                        ("calculation='bands'", "calculation='bands'"),
                        ("calculation='md', restart_mode='restart'", "restart_mode='restart'")):
        other = read_pw_input(_write(tmp_path, text.replace("calculation='scf'", change), "z.in"))
        assert other.reads_previous_run == why
    assert read_pw_input(_write(tmp_path, BASE.format(pd="/p", extra="", kcard=""),
                                "d.in")).conv_thr == 1e-6  # pw.x's default


def test_missing_and_foreign_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist"):
        read_pw_input(tmp_path / "nope.in")
    with pytest.raises(WorkloadError, match="is not a pw.x input"):
        read_pw_input(_write(tmp_path, "name: study\nparameters: {}\n", "study.yaml"))
    bad_k = BASE.format(pd="/p", extra="", kcard="K_POINTS automatic\n 4 4")
    with pytest.raises(WorkloadError, match="K_POINTS automatic"):
        read_pw_input(_write(tmp_path, bad_k))


def test_rewrite_control_replaces_paths_and_keeps_the_rest() -> None:
    text = BASE.format(pd="/p", extra="", kcard="K_POINTS gamma")
    out = rewrite_control(text, "/run/pseudo/", "/run/out/")
    assert "'/run/pseudo/'" in out and "'/run/out/'" in out
    assert "/p\"" not in out and "./scratch" not in out
    assert "prefix='t'" in out and "calculation='scf'" in out
    assert out.count("pseudo_dir") == 1 and out.count("outdir") == 1
    bare = rewrite_control("&system\n nat=1\n/\n", "/a/", "/b/")
    assert bare.startswith("&CONTROL\n")
    inline = rewrite_control("&control outdir='x', prefix='p'\n pseudo_dir='y'\n/\n", "/a/", "/b/")
    assert inline.count("outdir") == 1 and inline.count("pseudo_dir") == 1
    assert "prefix='p'" in inline and "'x'" not in inline and "'y'" not in inline


ONE_LINE = """\
# namelists closed on the line of their values, as many hand-written inputs do
 &CONTROL CALCULATION='scf', PREFIX='team', PSEUDO_DIR='../pp/a/b', OUTDIR='./s/' /
 &SYSTEM
    IBRAV=2, CELLDM(1)=10.26, NAT=2, NTYP=1,   ! two atoms / a comment
    ECUTWFC=25.0 /
 &ELECTRONS CONV_THR=1.0D-10 /
ATOMIC_SPECIES
 Si  28.086  Si.myname.UPF
ATOMIC_POSITIONS {alat}
 Si 0.00 0.00 0.00
 Si 0.25 0.25 0.25
K_POINTS {automatic}
 4 4 4 1 1 1
"""


def test_namelists_closed_on_the_line_of_their_values(tmp_path: Path) -> None:
    inp = read_pw_input(_write(tmp_path, ONE_LINE))
    assert inp.namelists["control"] == {"calculation": "scf", "prefix": "team",
                                        "pseudo_dir": "../pp/a/b", "outdir": "./s/"}
    assert inp.namelists["system"]["ecutwfc"] == "25.0"
    assert inp.conv_thr == 1e-10 and inp.prefix == "team"
    assert inp.kpoints.grid == (4, 4, 4) and inp.species[0].pseudo == "Si.myname.UPF"
    out = rewrite_control(inp.text, "/run/pseudo/", "/run/out/")
    staged = read_pw_input(_write(tmp_path, out, "staged.in"))
    assert staged.namelists["control"] == {"calculation": "scf", "prefix": "team",
                                           "pseudo_dir": "/run/pseudo/",
                                           "outdir": "/run/out/"}
    assert staged.namelists["system"] == inp.namelists["system"]
    assert out.count("&CONTROL") == 1 and "../pp" not in out


def test_stage_input_gives_each_run_its_own_pseudo_and_outdir(tmp_path: Path) -> None:
    inp = read_pw_input(SI)
    pseudos = resolve_pseudos(inp, None, generate=False).files
    runs = [tmp_path / "r1", tmp_path / "r2"]
    for run in runs:
        run.mkdir()
        staged = stage_input(inp, run, pseudos)
        assert staged == run / "pw.in"
        assert (run / "pseudo" / "Si.pz-vbc.UPF").is_file()
        again = read_pw_input(staged)
        assert again.pseudo_dir == (run / "pseudo").resolve()
        assert again.namelists["control"]["outdir"] == str((run / "out").resolve()) + "/"
        assert again.species == inp.species
        assert again.kpoints == inp.kpoints


def test_stage_input_refuses_a_missing_pseudopotential(tmp_path: Path) -> None:
    text = BASE.format(pd=str(tmp_path), extra="", kcard="K_POINTS gamma")
    inp = read_pw_input(_write(tmp_path, text))
    with pytest.raises(WorkloadError, match="Si.pz-vbc.UPF"):
        stage_input(inp, tmp_path / "run", {})


@needs_pw
def test_pw_counts_the_irreducible_kpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    inp = read_pw_input(SI)
    assert inp.nk_bound == 64
    answer = count_with_pw(inp, resolve_pseudos(inp, None, generate=False).files)
    assert answer is not None and answer.count == 10  # 4x4x4 shifted fcc, 48 symmetries
    assert answer.version.startswith("6.") or answer.version.startswith("7.")
    assert len(list((tmp_path / "tunelab" / "qe-kpoints").glob("*.json"))) == 1


def test_count_without_pw_is_none() -> None:
    assert shutil.which("no-such-pw.x") is None
    inp = read_pw_input(SI)
    assert count_with_pw(inp, {}, pw="no-such-pw.x") is None
