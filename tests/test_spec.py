from __future__ import annotations

import pytest

from tunelab.errors import StudyError
from tunelab.spec import load_study, parse_duration

HEAD = """\
name: s
workload:
  name: command
  options: {argv: [echo, "{np}"]}
"""


def test_a_full_study_loads(write_study):
    path = write_study(HEAD + """
parameters:
  np: [1, 2, 4]
  npool: {type: int, min: 1, max: 4, step: 1}
  ndiag: {type: pow2, min: 1, max: 16}
  gamma: {type: bool}
  algo: {values: [david, cg]}
derived:
  rpp: np // npool
constraints:
  - np % npool == 0
  - {expr: is_square(ndiag), why: square grid}
env:
  baseline: {}
  am: {UCX_RNDV_SCHEME: am, UCX_RNDV_THRESH: 1024}
repeats: 5
baseline: {np: 1, npool: 1, ndiag: 1, gamma: false, algo: david, env: baseline}
timeout: 2m
objective: {fom: wall_s, direction: minimize}
""")
    spec = load_study(path)
    values = {p.name: p.values for p in spec.parameters}
    assert values["npool"] == (1, 2, 3, 4)
    assert values["ndiag"] == (1, 2, 4, 8, 16)
    assert values["gamma"] == (False, True)
    assert spec.env_sets == {"baseline": {}, "am": {"UCX_RNDV_SCHEME": "am",
                                                    "UCX_RNDV_THRESH": "1024"}}
    assert spec.timeout_s == 120
    assert spec.parameter_names[-1] == "env"
    assert spec.constraints[1].why == "square grid"


def test_zero_step_error_names_file_line_parameter_and_value(write_study):
    path = write_study(HEAD + """
parameters:
  np: [1, 2]
  npool:
    type: int
    min: 1
    max: 4
    step: 0
""")
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert str(err.value) == (f"{path}:12: parameter 'npool': 'step' must be a positive "
                              "integer, got 0")


def test_malformed_yaml_gives_the_line(write_study):
    path = write_study(HEAD + "parameters:\n  np: [1, 2\n  x: 3\n")
    with pytest.raises(StudyError, match=rf"^{path}:\d+: malformed YAML"):
        load_study(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("repeats: 0\n", r":5: 'repeats': must be a whole number from 1 to .*got 0$"),
        ("repeats: lots\n", r":5: 'repeats': .*'auto', or \{min: M, max: N\}.*got 'lots'"),
        ("repeats: {min: 2}\n", r":5: 'repeats': .*3 <= M <= N.*got \{min: 2, max: 10\}"),
        ("repeats: {most: 4}\n", r":5: 'repeats': unknown field 'most'; it takes min and"),
        ("repeats: auto\n", r":5: repeats: auto .* the study needs a 'baseline:'"),
        ("colour: red\n", r":5: unknown field 'colour'; valid fields here: name, "),
        ("parameters:\n  np: 3\n", r":6: parameter 'np': must be a list of values"),
        ("parameters:\n  np: {type: float}\n", r"'type' must be one of int, pow2, bool"),
        ("parameters:\n  np: []\n", r"parameter 'np': the list of values is empty"),
        ("parameters:\n  np: {type: int, min: 4, max: 1}\n", r"'max' \(1\) is smaller"),
        ("constraints: ['np ==']\n", r":5: constraint 'np ==': invalid syntax"),
        ("constraints: ['os.system(1)']\n", r"unknown function 'os.system'"),
        ("timeout: soon\n", r":5: 'timeout' must be a duration"),
        ("env: {a: {UCX_TLS: on}}\n", r"quote values such as"),
        ("parameters: {np: [1]}\nbaseline: {nq: 1}\n", r"baseline names 'nq'"),
        ("search: {strategy: random}\n", r"'random' needs 'samples: N'"),
        ("constraints: [5]\n", r":5: 'constraints.0': input should be a valid string, got 5$"),
        ("objective: {direction: up}\n", r"missing required field 'objective.fom'"),
    ],
)
def test_bad_fields_are_one_line_errors_with_location(write_study, body, message):
    path = write_study(HEAD + body)
    with pytest.raises(StudyError, match=message) as err:
        load_study(path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(str(path))


def test_missing_file_and_non_mapping(tmp_path, write_study):
    with pytest.raises(StudyError, match="study file not found"):
        load_study(tmp_path / "nope.yaml")
    with pytest.raises(StudyError, match="must be a mapping"):
        load_study(write_study("- just\n- a list\n"))


def test_bytes_that_are_not_utf8_are_refused_naming_their_line_and_column(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: s\nworkload: {name: command}\nparameters:\n  x: [1, \x83]\n")
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert str(err.value) == (f"{path}:4: not UTF-8 text (byte 0x83 at column 10, "
                              "offset 55)")


def test_durations():
    assert parse_duration(90) == 90
    assert parse_duration("1h30m") == 5400
    assert parse_duration("45s") == 45
    for bad in ("", "-1", "1x", 0, True):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_repeats_auto_reads_its_bounds(write_study):
    body = HEAD + "parameters: {np: [1, 2]}\nbaseline: {np: 1}\n"
    auto = load_study(write_study(body + "repeats: auto\n", "a.yaml"))
    assert auto.auto_repeats == (3, 10) and auto.repeats == 10
    bounded = load_study(write_study(body + "repeats: {min: 4, max: 20}\n", "b.yaml"))
    assert bounded.auto_repeats == (4, 20) and bounded.repeats == 20
    fixed = load_study(write_study(body + "repeats: 5\n", "c.yaml"))
    assert fixed.auto_repeats is None and fixed.repeats == 5


def test_identity_ignores_repeats(write_study):
    a = load_study(write_study(HEAD + "parameters: {np: [1]}\nrepeats: 3\n", "a.yaml"))
    b = load_study(write_study(HEAD + "parameters: {np: [1]}\nrepeats: 9\n", "b.yaml"))
    c = load_study(write_study(HEAD + "parameters: {np: [1, 2]}\n", "c.yaml"))
    assert a.identity_hash() == b.identity_hash() != c.identity_hash()


@pytest.mark.parametrize(("section", "name", "why"), [
    ("parameters", "True", "expressions read True as the constant, never as the parameter"),
    ("parameters", "None", "expressions read None as the constant"),
    ("parameters", "False", "expressions read False as the constant"),
    ("parameters", "if", "'if' is a Python keyword, which no expression can use as a name"),
    ("parameters", "lambda", "is a Python keyword"),
    ("derived", "None", "never as the derived value"),
    ("derived", "in", "'in' is a Python keyword"),
])
def test_a_name_expressions_cannot_read_is_refused_with_its_line(write_study, section, name,
                                                                  why):
    body = (f"parameters:\n  '{name}': [1, 2]\n" if section == "parameters" else
            f"parameters:\n  np: [1, 2]\nderived:\n  '{name}': np * 2\n")
    path = write_study(HEAD + body)
    line = 6 if section == "parameters" else 8
    kind = "parameter" if section == "parameters" else "derived value"
    with pytest.raises(StudyError) as err:
        load_study(path)
    assert str(err.value).startswith(f"{path}:{line}: {kind} {name!r} cannot be named so: ")
    assert why in str(err.value) and "rename it" in str(err.value)


@pytest.mark.parametrize("name", ["match", "case", "type", "true", "none_", "If"])
def test_soft_keywords_and_look_alikes_stay_valid_names(write_study, name):
    spec = load_study(write_study(HEAD + f"parameters:\n  '{name}': [1, 2]\n"))
    assert spec.parameters[0].name == name
