"""The qe workload: options, rules, constants, check() and command building."""

from __future__ import annotations

import ast
import itertools
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tunelab.errors import WorkloadError
from tunelab.workload import RunContext
from tunelab.workloads import get_workload
from tunelab.workloads.qe import QEOptions, QEWorkload, pw_rules
from tunelab.workloads.qe.parser import parse_pw_output

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SI_IN = EXAMPLES / "qe" / "si.in"
needs_pw = pytest.mark.skipif(
    shutil.which("pw.x") is None or shutil.which("mpirun") is None,
    reason="pw.x (quantum-espresso) and mpirun (openmpi-bin) are needed",
)

FUNCS = {"is_square": lambda n: n >= 0 and math.isqrt(n) ** 2 == n, "min": min, "max": max}


def _names(expr: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}


def _valid(point: dict[str, Any], rules: list[tuple[str, str]], consts: dict[str, Any]) -> bool:
    """Apply rules as the engine does: a rule naming an unknown name is skipped. (eval here
    stands in for the engine's safe expression evaluator; the inputs are our own rules.)"""
    scope = {**consts, **point}
    for expr, _why in rules:
        if not _names(expr) <= set(scope) | set(FUNCS):
            continue
        if not eval(expr, {"__builtins__": {}}, {**FUNCS, **scope}):  # noqa: S307
            return False
    return True


def _expand(spec: Any) -> list[Any]:
    if isinstance(spec, list):
        return spec
    return list(range(spec["min"], spec["max"] + 1, spec.get("step", 1)))


def _study_points(study_file: Path, cores: int, nk: int) -> list[dict[str, Any]]:
    study = yaml.safe_load(study_file.read_text())
    opts = QEOptions(**study["workload"]["options"])
    params = {k: _expand(v) for k, v in study["parameters"].items()}
    combos = itertools.product(*params.values())
    points = [dict(zip(params, combo, strict=True)) for combo in combos]
    rules = pw_rules(opts.oversubscribe)
    return [p for p in points if _valid(p, rules, {"cores": cores, "nk": nk})]


def _ctx(tmp_path: Path, values: dict[str, Any], cores: int = 2, env: dict[str, str] | None = None
         ) -> RunContext:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    return RunContext(values, env or {}, run, tmp_path, None, cores)


def _si(tmp_path: Path | None = None, **opts: Any) -> QEWorkload:
    study_file = EXAMPLES / "qe-si.yaml"
    return QEWorkload(QEOptions(input="qe/si.in", **opts), study_file)


def test_registered_under_its_name() -> None:
    assert get_workload("qe") is QEWorkload
    assert QEWorkload.name == "qe"


def test_options_defaults_and_validation() -> None:
    opts = QEOptions(input="si.in")
    assert (opts.pw, opts.mpirun, opts.mpi_args, opts.oversubscribe) == (
        "pw.x", "mpirun", (), False)
    assert opts.energy_tolerance is None and opts.pseudo_dir is None
    with pytest.raises(ValidationError):
        QEOptions(input="si.in", energy_tolerance=0)
    with pytest.raises(ValidationError):
        QEOptions(input="si.in", npools=2)  # unknown option
    with pytest.raises(ValidationError):
        QEOptions()  # input is required
    from_dict = QEWorkload({"input": "qe/si.in", "mpi_args": ["-x", "A"]}, None)
    assert from_dict.opts.mpi_args == ("-x", "A")


def test_objective_invariants_and_rules() -> None:
    wl = _si(energy_tolerance=2e-6)
    assert (wl.objective.fom, wl.objective.direction) == ("pwscf_wall_s", "minimize")
    assert wl.invariants() == {"total_energy_ry": 2e-6}
    exprs = [e for e, _ in wl.rules()]
    for expected in ("np % npool == 0", "is_square(ndiag)", "ndiag <= np // npool",
                     "(np // npool) % ntg == 0", "npool <= nk", "np * omp <= cores"):
        assert expected in exprs
    assert all(why for _, why in wl.rules())
    assert "np * omp <= cores" not in [e for e, _ in pw_rules(oversubscribe=True)]


def test_a_run_pw_made_with_other_values_than_asked_is_named() -> None:
    data = Path(__file__).parent / "data"
    serial = parse_pw_output((data / "si_np1.out").read_text())  # MPI-only build, 1 rank
    wl = _si()
    assert wl.configuration_problem({"np": 1, "npool": 1, "omp": 1}, serial) is None
    why = wl.configuration_problem({"np": 1, "omp": 2}, serial)
    assert why == ("pw.x ran with 1 OpenMP threads per process, not omp=2 (this pw.x is built "
                   "without OpenMP, or ignored OMP_NUM_THREADS), as it prints: the run "
                   "measured another configuration than its point")
    qe72 = parse_pw_output((data / "qe72_ceo2_excerpt.out").read_text())
    asked = {"np": 40, "npool": 10, "ndiag": 4, "ntg": 2, "omp": 2}
    assert wl.configuration_problem(asked, qe72) is None
    why = wl.configuration_problem({**asked, "ndiag": 9, "ntg": 1}, qe72)
    assert why is not None
    assert "4 ranks in the diagonalisation group, not ndiag=9; 2 FFT task groups, not ntg=1" \
        in why


def test_each_runs_outdir_is_scratch_unless_kept(tmp_path: Path) -> None:
    assert _si().scratch(tmp_path) == (tmp_path / "out",)
    assert _si(keep_outdir=True).scratch(tmp_path) == ()


def test_a_parameter_named_like_the_kpoint_constant_is_refused(tmp_path: Path) -> None:
    """pw.x's -nk is npool: a parameter nk was passed to no program and replaced the
    k-point count in the rule npool <= nk."""
    from tests.conftest import tunelab

    study = tmp_path / "s.yaml"
    study.write_text(f"name: s\nworkload:\n  name: qe\n  options:\n    input: {SI_IN}\n"
                     "parameters:\n  np: [1, 2]\n  npool: [1, 2]\n  nk: [1, 2]\n")
    res = tunelab("space", study)
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"tunelab: error: {study}:9: parameter 'nk' has the name of a constant of the study "
        "(cores, cores_per_node, nk), which the constraints and the workload's rules read: "
        "name it otherwise")


@pytest.mark.parametrize("name", ["nd", "nt", "npools", "ranks"])
def test_a_parameter_pw_is_never_given_is_refused(tmp_path: Path, name: str) -> None:
    """pw.x's short flags (-nd, -nt) or a misspelling were axes passed to no program: every
    value ran the same command."""
    from tests.conftest import tunelab

    study = tmp_path / "s.yaml"
    study.write_text(f"name: s\nworkload:\n  name: qe\n  options:\n    input: {SI_IN}\n"
                     f"parameters:\n  np: [1, 2]\n  {name}: [1, 4]\n")
    for command in (["space"], ["run", "--dry-run"]):
        res = tunelab(*command, study)
        assert res.returncode == 2
        assert res.stderr.strip() == (
            f"tunelab: error: {study}:8: workload 'qe' does not use a parameter {name!r}: "
            "every value would run the same command; its parameters are ndiag, nodes, np, "
            "npool, ntg, omp, ppn")


def test_demo_study_has_seven_valid_points() -> None:
    points = _study_points(EXAMPLES / "qe-si.yaml", cores=2, nk=10)
    got = sorted((p["np"], p["npool"], p["ndiag"]) for p in points)
    assert got == [(1, 1, 1), (2, 1, 1), (2, 2, 1), (4, 1, 1), (4, 1, 4), (4, 2, 1), (4, 4, 1)]


def test_rules_drop_what_pw_would_run_identically_or_refuse() -> None:
    rules = pw_rules()
    consts = {"cores": 8, "nk": 3}
    assert not _valid({"np": 2, "npool": 3, "ndiag": 1}, rules, consts)   # npool ∤ np
    assert not _valid({"np": 4, "npool": 1, "ndiag": 2}, rules, consts)   # not a square
    assert not _valid({"np": 4, "npool": 2, "ndiag": 4}, rules, consts)   # 4 > 2 ranks/pool
    assert not _valid({"np": 8, "npool": 4, "ndiag": 1}, rules, consts)   # 4 pools > 3 k-points
    assert not _valid({"np": 4, "npool": 1, "ntg": 3}, rules, consts)     # ntg ∤ ranks/pool
    assert not _valid({"np": 4, "omp": 4}, rules, consts)                 # 16 > 8 cores
    assert not _valid({"np": 16}, rules, consts)
    assert _valid({"np": 16}, pw_rules(oversubscribe=True), consts)
    assert _valid({"np": 8, "npool": 2, "ndiag": 4, "ntg": 2, "omp": 1}, rules, consts)
    # A study without ntg or omp: those rules are skipped, the others still apply.
    assert _valid({"np": 2, "npool": 2, "ndiag": 1}, rules, consts)


@needs_pw
def test_constants_read_nk_from_the_input() -> None:
    assert _si().constants() == {"nk": 10}  # pw.x's own count: 64 grid points -> 10
    assert _si(nk=5).constants() == {"nk": 5}


def test_nk_is_computed_by_the_rules_without_pw() -> None:
    wl = _si(pw="no-such-pw.x")
    assert wl.constants() == {"nk": 10}  # 64 grid points, 48 symmetries
    assert "computed with pw.x 6.7's symmetry rules" in wl.setup.nk.source


@needs_pw
def test_default_space_obeys_the_rules() -> None:
    space = _si().default_space()
    assert set(space) == {"np", "npool", "ndiag"}
    assert 1 in space["np"] and max(space["np"]) <= (os.cpu_count() or 1)
    assert all(math.isqrt(d) ** 2 == d for d in space["ndiag"])
    assert max(space["npool"]) <= 10


def test_input_path_is_relative_to_the_study_file() -> None:
    assert _si().input_path == EXAMPLES / "qe" / "si.in"
    wl = QEWorkload(QEOptions(input="si.in"), None)
    assert wl.input_path == Path.cwd() / "si.in"


@needs_pw
def test_check_accepts_the_examples() -> None:
    _si().check()
    QEWorkload(QEOptions(input="qe/si8.in"), EXAMPLES / "qe-si8.yaml").check()


def test_check_refuses_missing_programs_inputs_and_pseudopotentials(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="quantum-espresso"):
        _si(pw="no-such-pw.x").check()
    with pytest.raises(WorkloadError, match="openmpi-bin"):  # pw found: the launcher is not
        _si(pw=sys.executable, mpirun="no-such-mpirun").check()
    if shutil.which("pw.x") is None or shutil.which("mpirun") is None:
        pytest.skip("the remaining checks need pw.x and mpirun installed")
    with pytest.raises(WorkloadError, match="does not exist"):
        QEWorkload(QEOptions(input="missing.in"), tmp_path / "s.yaml").check()
    (tmp_path / "notpw.in").write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(WorkloadError, match="is not a pw.x input"):
        QEWorkload(QEOptions(input="notpw.in"), tmp_path / "s.yaml").check()
    text = (EXAMPLES / "qe" / "si.in").read_text().replace("Si.pz-vbc.UPF", "Si.nope.UPF")
    (tmp_path / "si.in").write_text(text)
    with pytest.raises(WorkloadError, match=r"pseudopotential 'Si.nope.UPF'.*none of the pla"):
        QEWorkload(QEOptions(input="si.in"), tmp_path / "s.yaml").check()


def test_command_line_for_a_full_point(tmp_path: Path) -> None:
    wl = _si()
    ctx = _ctx(tmp_path, {"np": 4, "npool": 2, "ndiag": 1, "ntg": 2, "omp": 1}, cores=2,
               env={"UCX_TLS": "tcp"})
    cmd = wl.command(ctx)
    argv = list(cmd.argv)
    assert argv[:3] == ["mpirun", "-np", "4"]
    assert "--oversubscribe" in argv
    assert ("--allow-run-as-root" in argv) == (os.geteuid() == 0)
    pw = argv.index(next(a for a in argv if a.endswith("pw.x")))
    assert argv[pw + 1:] == ["-npool", "2", "-ndiag", "1", "-ntg", "2", "-inp", "pw.in"]
    assert cmd.cwd == ctx.run_dir
    assert cmd.env["OMP_NUM_THREADS"] == "1"
    assert cmd.env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert cmd.env["UCX_TLS"] == "tcp"
    assert (ctx.run_dir / "pw.in").is_file()
    assert (ctx.run_dir / "pseudo" / "Si.pz-vbc.UPF").is_file()
    assert (ctx.run_dir / "out").is_dir()


def test_command_emits_only_the_flags_of_present_parameters(tmp_path: Path) -> None:
    cmd = _si().command(_ctx(tmp_path, {"np": 2, "omp": 3}, cores=8))
    argv = list(cmd.argv)
    assert "-npool" not in argv and "-ndiag" not in argv and "-ntg" not in argv
    assert argv[-2:] == ["-inp", "pw.in"]
    assert "--oversubscribe" not in argv
    assert cmd.env["OMP_NUM_THREADS"] == "3"
    assert "OMPI_MCA_mpi_yield_when_idle" not in cmd.env


def test_command_uses_the_configured_launcher(tmp_path: Path) -> None:
    wl = _si(mpirun="srun", mpi_args=("--mpi=pmix",), pw="/opt/qe/bin/pw.x")
    argv = list(wl.command(_ctx(tmp_path, {"np": 8, "npool": 4}, cores=2)).argv)
    assert argv == ["srun", "-n", "8", "--mpi=pmix", "/opt/qe/bin/pw.x", "-npool", "4",
                    "-inp", "pw.in"]


def test_ranks_of_several_threads_get_cores_for_them(tmp_path: Path) -> None:
    """Open MPI binds each rank of a run of <= 2 ranks to one core: omp=2 ran both OpenMP
    threads on it, so an OpenMP build looked no faster with threads."""
    def argv(values: dict[str, Any], **opts: Any) -> list[str]:
        return list(_si(**opts).command(_ctx(tmp_path, values, cores=8)).argv)

    bound = argv({"np": 1, "omp": 2})
    assert bound[bound.index("--bind-to") + 1] == "none"
    assert bound.index("--bind-to") < bound.index(next(a for a in bound if a.endswith("pw.x")))
    assert "--bind-to" not in argv({"np": 2, "omp": 1})
    mapped = argv({"np": 2, "omp": 2}, mpi_args=("--map-by", "slot:PE=2"))
    assert "--bind-to" not in mapped and "slot:PE=2" in mapped
    assert argv({"np": 2, "omp": 4}, mpirun="srun")[:4] == ["srun", "-n", "2",
                                                            "--cpus-per-task=4"]
    assert argv({"np": 2, "omp": 4}, mpirun="srun", mpi_args=("-c", "4")).count("4") == 1


def test_command_does_not_second_guess_an_explicit_point(tmp_path: Path) -> None:
    # Refusing impossible points is the engine's job (it knows the rules); the command is
    # built as asked so that pw.x's own error can be recorded when a user forces it.
    argv = list(_si().command(_ctx(tmp_path, {"np": 2, "npool": 3})).argv)
    assert argv[argv.index("-npool") + 1] == "3"


@pytest.mark.slow
@needs_pw
def test_ceo2_example_generates_its_ce_pseudopotential(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TUNELAB_PSEUDO_DIR", str(tmp_path))
    wl = QEWorkload(QEOptions(input="qe/ceo2.in"), EXAMPLES / "qe-ceo2.yaml")
    wl.check()  # generates Ce.pbe-spdn4fc-kjpaw_tunelab.UPF on demand
    assert (tmp_path / "Ce.pbe-spdn4fc-kjpaw_tunelab.UPF").is_file()
    # pw.x reads both pseudopotentials before it counts k-points: 8 proves the generated
    # (re-wrapped) Ce file is readable by pw.x 6.7; 64 would mean the count failed.
    assert wl.constants() == {"nk": 8}
