"""The objective and the FOM names a study may use, checked when it is loaded: the names the
engine records itself and empty names are refused, and so is an objective that the workload
declares it never produces — but never one a real workload's runs do give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tunelab.errors import StudyError
from tunelab.execute.study import prepare_study
from tunelab.safeyaml import load_yaml
from tunelab.spec import StudySpec, load_study

ROOT = Path(__file__).parents[2]


def command_yaml(foms: str = "{v: 'v=(?P<value>\\d)'}", objective: str | None = None,
                 json_line: bool = False) -> str:
    return ("name: o\n"
            f"workload: {{name: command, options: {{argv: [echo, 'v=5'], foms: {foms}, "
            f"json_line: {str(json_line).lower()}}}}}\n"
            "parameters: {x: [1]}\n"
            + (f"objective: {{fom: {objective!r}}}\n" if objective is not None else ""))


def prepared(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "o.yaml"
    path.write_text(text)
    return prepare_study(load_study(path), dry_run=True)


def example(name: str, objective: str) -> Any:
    """An example study of the repository, with another objective."""
    path = ROOT / name
    data, _ = load_yaml(path.read_text(), str(path))
    data["objective"] = {"fom": objective}
    return prepare_study(StudySpec.from_mapping(data, source=str(path), path=path),
                         dry_run=True)


@pytest.mark.parametrize(("foms", "fragment"), [
    ("{wall_s: 'w=(?P<value>\\S+)'}", "FOM 'wall_s': the name is reserved"),
    ("{'': 'w=(?P<value>\\S+)'}", "FOM '': a FOM name must not be empty"),
    ("{' ': 'w=(?P<value>\\S+)'}", "FOM ' ': a FOM name must not be empty"),
])
def test_a_command_fom_named_as_the_engine_records_or_empty_is_refused(tmp_path, foms,
                                                                       fragment):
    with pytest.raises(StudyError, match=r"o\.yaml:2: workload 'command' option 'foms'") as exc:
        prepared(tmp_path, command_yaml(foms))
    assert fragment in str(exc.value)


@pytest.mark.parametrize("objective", ["nosuch", "V", ""])
def test_an_objective_the_command_regexes_never_give_is_refused(tmp_path, objective):
    with pytest.raises(StudyError, match=rf"o\.yaml:4: 'objective.fom' {objective!r}: ") as exc:
        prepared(tmp_path, command_yaml(objective=objective))
    assert ("produces v, wall_s" if objective else "must not be empty") in str(exc.value)


@pytest.mark.parametrize("objective", ["v", "wall_s", None])
def test_an_objective_the_command_gives_is_accepted(tmp_path, objective):
    study = prepared(tmp_path, command_yaml(objective=objective))
    assert study.objective.fom == (objective or "wall_s")


def test_with_a_json_line_any_objective_is_accepted(tmp_path):
    assert prepared(tmp_path, command_yaml(objective="from_json", json_line=True)
                    ).objective.fom == "from_json"


@pytest.mark.parametrize(("name", "objective"), [
    ("examples/storage-resnet50.yaml", "au"),                   # ddp: its JSON-line figures
    ("examples/storage-resnet50.yaml", "energy_J_per_sample"),
    ("examples/storage-resnet50.yaml", "input_bound"),          # ... and its flags
    ("examples/merge-transports.yaml", "bandwidth_median"),     # merge
    ("examples/qe-si.yaml", "timer.electrons.wall_s"),          # qe: read from the output
    ("examples/qe-si.yaml", "total_energy_ry"),
    ("examples/leopard-tune.yaml", "val_loss"),                 # leopard: any JSON member
    ("benchmarks/landscapes/qe-si8.yaml", "pwscf_wall_s"),      # replay: its recorded FOM
    ("examples/merge-transports.yaml", "wall_s"),               # every workload's runs
])
def test_every_workload_accepts_an_objective_its_runs_give(name, objective):
    assert example(name, objective).objective.fom == objective


@pytest.mark.parametrize("name", ["examples/storage-resnet50.yaml",
                                  "examples/merge-transports.yaml",
                                  "benchmarks/landscapes/qe-si8.yaml"])
def test_workloads_that_declare_their_foms_refuse_another_objective(name):
    with pytest.raises(StudyError, match="'objective.fom' 'nosuch': workload '.*' produces "
                                         "no such figure of merit"):
        example(name, "nosuch")
