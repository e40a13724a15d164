"""k-points as pw.x distributes them: pw.x 6.7's symmetry rules against pw.x itself.

``CORPUS`` records, for every input of ``corpus/``, what pw.x 6.7 printed here ("number of
k points=", per spin for LSDA; "N Sym. Ops."). The fast tests check the rules against that
record; the slow ones ask the real pw.x again, so a record can never drift from the program.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tunelab.workloads.qe import QEOptions, QEWorkload
from tunelab.workloads.qe.kpoints import compute_kpoints
from tunelab.workloads.qe.pseudo_search import resolve_pseudos
from tunelab.workloads.qe.pwcount import count_with_pw
from tunelab.workloads.qe.pwinput import PwInput, read_pw_input, stage_input

CORPUS_DIR = Path(__file__).parent / "corpus"
needs_pw = pytest.mark.skipif(
    shutil.which("pw.x") is None or shutil.which("mpirun") is None,
    reason="pw.x (quantum-espresso) and mpirun (openmpi-bin) are needed",
)

# input: (k-points pw.x printed, spins it distributes, crystal symmetry operations)
CORPUS = {
    "al-metal.in": (28, 1, 48),            # fcc metal, 6x6x6 shifted grid
    "bn-ibrav0.in": (4, 1, 24),            # CELL_PARAMETERS in Angstrom, no inversion
    "bn-noncolin-mag.in": (7, 1, 8),       # magnetic: no time reversal, magnetic group
    "bn-noncolin-nonmag.in": (4, 1, 24),   # noncollinear without moments: time reversal kept
    "fe-afm-lsda.in": (4, 2, 48),          # two species of one element, LSDA
    "fe-lsda.in": (3, 2, 48),              # the case: 3 per spin, 6 distributed
    "fe-noncolin-grid.in": (8, 1, 8),      # spin-orbit, tilted moment, automatic grid
    "fe-noncolin-so.in": (18, 1, 16),      # spin-orbit, explicit list of 11 expanded to 18
    "mg-hcp.in": (8, 1, 24),               # hexagonal, fractional translations
    "pt-so-nonmag.in": (6, 1, 48),         # spin-orbit without magnetism
    "si-bands.in": (40, 1, 48),            # crystal_b path in a bands run: as listed
    "si-berry.in": (15, 1, 1),             # Berry-phase strings: 3 x nppstr 5
    "si-gamma.in": (1, 1, 24),             # K_POINTS gamma
    "si-klist.in": (6, 1, 4),              # explicit list of 2 on a distorted crystal
    "si-md.in": (8, 1, 1),                 # nosym: the grid reduced by k <-> -k only
    "si-nosym-crystal.in": (3, 1, 1),      # nosym, crystal list: used as given
    "si-nscf.in": (16, 1, 48),             # 6x6x6 unshifted grid
    "si-path-scf.in": (19, 1, 4),          # tpiba_b path in an scf run: expanded
    "si-pbe0.in": (3, 1, 48),              # hybrid functional
    "si-relax.in": (6, 1, 4),              # relax from a displaced atom
    "si-scf.in": (10, 1, 48),              # the classic 10 of a 4x4x4 shifted grid
}
PW_REFUSES = {"si-bad-namelist.in"}        # a QE 7.x variable pw.x 6.7 cannot read


def test_the_corpus_is_recorded_completely() -> None:
    names = {p.name for p in CORPUS_DIR.glob("*.in")}
    assert names == set(CORPUS) | PW_REFUSES


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_rules_count_what_pw_distributes(name: str) -> None:
    printed, spins, nsym = CORPUS[name]
    result = read_pw_input(CORPUS_DIR / name).count_kpoints()
    assert result is not None
    assert (result.per_spin, result.spins, result.count) == (printed, spins, printed * spins)
    assert result.nsym == nsym


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_card_bound_is_an_upper_bound_of_what_pw_distributes(name: str) -> None:
    """nk_bound stands in for the count where the rules do not model an input; an explicit
    list was taken as its length, under what pw.x distributes once it adds the images of
    the points (si-klist: 2 listed, 6 distributed), so 'npool <= nk' refused valid pools."""
    printed, spins, _ = CORPUS[name]
    assert read_pw_input(CORPUS_DIR / name).nk_bound >= printed * spins


def test_the_bound_keeps_every_valid_npool_of_an_input_the_rules_do_not_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(PwInput, "count_kpoints", lambda self: None)
    wl = QEWorkload(QEOptions(input=str(CORPUS_DIR / "si-klist.in")), tmp_path / "s.yaml")
    wl.dry_run = True
    assert wl.nk >= 6  # pw.x distributes 6: npool=6 must stay a valid point
    assert "an upper bound from the K_POINTS card" in wl.setup.nk.source


def test_lsda_doubles_and_npool_up_to_six_is_valid() -> None:
    result = read_pw_input(CORPUS_DIR / "fe-lsda.in").count_kpoints()
    assert result is not None and (result.per_spin, result.count) == (3, 6)


def _system(**extra: str) -> dict[str, dict[str, str]]:
    return {"system": {"nat": "1", "ntyp": "1", **extra}}


ONE_ATOM = {"ATOMIC_POSITIONS": ("crystal", ["X 0 0 0"]),
            "K_POINTS": ("automatic", ["2 2 2 0 0 0"])}


@pytest.mark.parametrize(
    ("system", "nrot"),
    [
        ({"ibrav": "1", "celldm(1)": "10"}, 48),
        ({"ibrav": "2", "celldm(1)": "10"}, 48),
        ({"ibrav": "-3", "a": "2.9"}, 48),
        ({"ibrav": "4", "celldm(1)": "6", "celldm(3)": "1.6"}, 24),
        ({"ibrav": "5", "celldm(1)": "8", "celldm(4)": "0.3"}, 12),
        ({"ibrav": "6", "celldm(1)": "6", "celldm(3)": "1.3"}, 16),
        ({"ibrav": "8", "celldm(1)": "6", "celldm(2)": "1.2", "celldm(3)": "1.4"}, 8),
        ({"ibrav": "12", "celldm(1)": "6", "celldm(2)": "1.2", "celldm(3)": "1.4",
          "celldm(4)": "0.2"}, 4),
        ({"ibrav": "14", "celldm(1)": "6", "celldm(2)": "1.2", "celldm(3)": "1.4",
          "celldm(4)": "0.1", "celldm(5)": "0.2", "celldm(6)": "0.3"}, 2),
    ],
)
def test_lattice_symmetry_of_each_bravais_lattice(system: dict[str, str], nrot: int) -> None:
    result = compute_kpoints(_system(**system), ONE_ATOM, ["X"])
    assert result is not None and result.nrot == nrot == result.nsym


def test_what_the_rules_do_not_model_is_none() -> None:
    cards = dict(ONE_ATOM)
    assert compute_kpoints(_system(ibrav="2"), cards, ["X"]) is None  # no lattice constant
    assert compute_kpoints(_system(ibrav="2", **{"celldm(1)": "10", "space_group": "225"}),
                           cards, ["X"]) is None
    sg = {**cards, "ATOMIC_POSITIONS": ("crystal_sg", ["X 0 0 0"])}
    assert compute_kpoints(_system(ibrav="2", **{"celldm(1)": "10"}), sg, ["X"]) is None
    huge = {**cards, "K_POINTS": ("automatic", ["100 100 100 0 0 0"])}
    assert compute_kpoints(_system(ibrav="2", **{"celldm(1)": "10"}), huge, ["X"]) is None
    bad = {**cards, "K_POINTS": ("automatic", ["2 2"])}
    assert compute_kpoints(_system(ibrav="2", **{"celldm(1)": "10"}), bad, ["X"]) is None


# -- the real pw.x ---------------------------------------------------------------------


@pytest.mark.slow
@needs_pw
@pytest.mark.parametrize("name", sorted(n for n in CORPUS if n not in ("si-nscf.in",
                                                                        "si-bands.in")))
def test_pw_counts_the_same(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nscf and bands inputs need the scf's data: their counts are checked by the
    workflow tests, from the runs' own output."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    inp = read_pw_input(CORPUS_DIR / name)
    answer = count_with_pw(inp, resolve_pseudos(inp, None, generate=False).files)
    printed, spins, _ = CORPUS[name]
    assert answer is not None
    assert (answer.printed, answer.count) == (printed, printed * spins)


def _pools_line(tmp_path: Path, np_: int) -> list[str]:
    """pw.x's output up to its k-point count, run with np ranks in np pools."""
    inp = read_pw_input(CORPUS_DIR / "fe-lsda.in")
    run = tmp_path / f"np{np_}"
    staged = stage_input(inp, run, resolve_pseudos(inp, None, generate=False).files)
    argv = ["mpirun", "-np", str(np_), "--oversubscribe"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    argv += ["pw.x", "-npool", str(np_), "-inp", staged.name]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMPI_MCA_mpi_yield_when_idle": "1"}
    proc = subprocess.Popen(argv, cwd=run, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if re.search(r"number of k points=", line):
                break
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=60)
    return lines


@pytest.mark.slow
@needs_pw
def test_pw_gives_every_one_of_six_pools_a_spin_k_point(tmp_path: Path) -> None:
    six = "".join(_pools_line(tmp_path, 6))
    assert re.search(r"K-points division:\s+npool\s*=\s*6\b", six)
    assert "some nodes have no k-points" not in six
    assert "some nodes have no k-points" in "".join(_pools_line(tmp_path, 7))
