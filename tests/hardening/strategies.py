"""Hypothesis strategies that write study files: plausible ones with hostile parts (argv
templates, expressions, values, environment sets, counts), and broken YAML made from them.

Programs are never chosen at random: ``argv[0]`` is ``echo`` or this Python, so a fuzzed
``tunelab run`` starts only harmless programs.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml
from hypothesis import strategies as st

PY = sys.executable
NAMES = ("a", "b", "np", "x_1")
OTHER_NAMES = ("cores", "nk", "zz", "env", "__class__", "")

# --- scalars ------------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
hostile_texts = st.sampled_from([
    "", " ", "{", "}", "{{", "}}", "{a}", "=", "A=B", "\x00", "\x1b[31m", "'", '"', "\\", "\n",
    "*a", "&a", "<<", "---", "%s", "é", "☃", "a" * 300, "0x10", "1e309", "nan", "-inf",
])
numbers = st.one_of(
    st.integers(-3, 10), st.integers(-(10**30), 10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, 2**63, -(2**63)]))
scalars = st.one_of(numbers, st.booleans(), texts, hostile_texts, st.none())

# --- expressions --------------------------------------------------------------------------

_leaves = st.one_of(
    st.sampled_from(NAMES + OTHER_NAMES[:3]),
    st.integers(-5, 100).map(str), st.sampled_from(["10**64", "2**4000", "1e308", "0", "-1"]),
    st.sampled_from(["'a'", "'%d'", "'\\\\x00'", "True", "None", "(1, 2)"]),
)


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "<",
                                                  "==", "!=", " and ", " or ", " in "]),
                       children).map(lambda t: f"({t[0]}{t[1]}{t[2]})")
    unary = st.tuples(st.sampled_from(["-", "+", "not "]), children).map(lambda t: t[0] + t[1])
    call = st.tuples(st.sampled_from(["is_square", "is_pow2", "sqrt", "isqrt", "log2", "min",
                                      "max", "abs", "int", "float", "round", "len", "eval"]),
                     st.lists(children, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})")
    cond = st.tuples(children, children, children).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})")
    return st.one_of(binary, unary, call, cond)


expressions = st.one_of(
    st.recursive(_leaves, _combine, max_leaves=12),
    st.sampled_from(["((((10**64)**64)**64)**64)**64 > a", "'a' * (4*10**9)", "'a' * 10**11",
                     "-" * 3000 + "a", "+".join(["a"] * 900), "abs(" * 80 + "a" + ")" * 80,
                     "a.__class__", "[x for x in (1,)]", "lambda: 1", "a[0]", "f'{a}'",
                     "__import__('os')", ")(", ""]),
)

# --- argv templates -----------------------------------------------------------------------

_specs = st.sampled_from(["", ":>8", ":>3000000000", ":.3f", ":d", ":x", ":{a}", "!r", "!z",
                          ":<1001", ":,", ":%", ":=^20", ":.99999999f"])
_placeholders = st.tuples(st.sampled_from(NAMES + OTHER_NAMES), _specs).map(
    lambda t: "{" + t[0] + t[1] + "}")
argv_args = st.lists(st.one_of(_placeholders, texts, hostile_texts), max_size=4).map("".join)


# --- parameters, env sets, the rest ---------------------------------------------------------


def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any],
           hostile_in: int = 6) -> st.SearchStrategy[Any]:
    """``valid``, and ``hostile`` about once in ``hostile_in`` draws: a study with one or two
    hostile parts gets past the first check and reaches the later ones."""
    return one_in(hostile_in).flatmap(lambda yes: hostile if yes else valid)


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in ``n`` draws (Hypothesis favours the ends of an integer range, so
    the chosen residue is one that neither end has)."""
    return st.integers(1, 10 * n + 1).map(lambda k: k % n == n // 2 + 1 if n > 2 else k % n == 0)


safe_values = st.one_of(st.integers(-3, 64), st.sampled_from(["x", "fast", "a b", "0.5"]),
                        st.floats(-10, 10, allow_nan=False).map(lambda f: round(f, 2)))
parameter_specs = mostly(
    st.one_of(st.lists(safe_values, min_size=1, max_size=3, unique_by=lambda v: (type(v), v)),
              st.fixed_dictionaries({"type": st.just("int"), "min": st.integers(-3, 3),
                                     "max": st.integers(3, 5)}),
              st.fixed_dictionaries({"type": st.just("pow2"), "min": st.integers(1, 4),
                                     "max": st.integers(4, 16)}),
              st.just({"type": "bool"})),
    st.one_of(
        st.lists(scalars, min_size=0, max_size=4),
        st.fixed_dictionaries({"type": st.just("int"), "min": numbers, "max": numbers},
                              optional={"step": numbers}),
        st.fixed_dictionaries({"type": st.sampled_from(["pow2", "bool", "float", None]),
                               "min": numbers, "max": numbers}),
        st.fixed_dictionaries({"values": st.one_of(st.lists(scalars, max_size=4), scalars)}),
        scalars))
env_sets = mostly(
    st.dictionaries(st.sampled_from(["base", "fast", "slow"]),
                    st.one_of(st.none(), st.dictionaries(st.sampled_from(["OMP", "TL_X"]),
                                                         safe_values, max_size=2)),
                    min_size=1, max_size=3),
    st.dictionaries(
        st.one_of(st.sampled_from(["base", "fast", "a b"]), texts),
        st.one_of(st.none(), st.dictionaries(st.one_of(
            st.sampled_from(["OMP", "A=B", "1X", ""]), texts), scalars, max_size=2)),
        max_size=3))


@st.composite
def argvs(draw: st.DrawFn, names: list[str]) -> list[str]:
    """A harmless program and arguments with placeholders of ``names`` (mostly)."""
    program = draw(st.sampled_from([["echo"], [PY, "-c", "print('v=1.5')"],
                                    [PY, "-c", "print('v=nan')"],
                                    [PY, "-c", 'print(\'{{"v": 2}}\')']]))
    good = (st.sampled_from(names).map(lambda n: "{" + n + "}") if names
            else st.just("--flag"))
    return [*program, *draw(st.lists(mostly(good, argv_args), max_size=3))]


@st.composite
def studies(draw: st.DrawFn) -> dict[str, Any]:
    """A study as data: mostly plausible, with a few hostile parts drawn in."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=0, max_size=3, unique=True))
    study: dict[str, Any] = {
        "name": draw(mostly(st.just("fz"), st.one_of(texts, hostile_texts))),
        "workload": {"name": draw(mostly(st.just("command"), st.sampled_from(["nosuch", "qe"]))),
                     "options": {"argv": draw(argvs(names))}},
        "parameters": {n: draw(parameter_specs) for n in names},
        "repeats": draw(mostly(st.integers(1, 2), st.one_of(numbers, st.booleans()))),
        "timeout": draw(mostly(st.just(30), st.one_of(
            numbers, st.booleans(), texts, st.sampled_from(["5m", "-1s", "1" * 100])))),
    }
    options = study["workload"]["options"]
    if draw(one_in(2)):
        options["foms"] = {"v": draw(mostly(st.just("v=(?P<value>\\S+)"), st.sampled_from(
            ["(a+)+$", "(", "v=(\\d+)", "no group", "(?P<value>)", "(?P<value>.*)"])))}
    if draw(one_in(5)):
        options["json_line"] = draw(mostly(st.booleans(), scalars))
    if draw(one_in(6)):
        options["env"] = draw(st.dictionaries(st.sampled_from(["OK", "A=B", "", "X\x00"]),
                                              scalars, max_size=2))
    if draw(one_in(6)):
        options["cwd"] = draw(st.sampled_from([".", "/no/such/dir", "", "s.yaml"]))
    optional = {
        "derived": st.dictionaries(st.sampled_from(["d", "a", "e2"]), expressions, max_size=2),
        "constraints": st.lists(mostly(expressions, st.fixed_dictionaries(
            {"expr": expressions}, optional={"why": texts})), max_size=3),
        "env": env_sets,
        "search": mostly(
            st.fixed_dictionaries({"strategy": st.sampled_from(["grid", "random"])},
                                  optional={"samples": st.integers(1, 5), "seed": st.integers()}),
            st.fixed_dictionaries({"strategy": st.sampled_from(["grid", "random", "optuna",
                                                                "bogus"])},
                                  optional={"samples": numbers, "seed": numbers})),
        "baseline": st.dictionaries(st.sampled_from(NAMES + ("env",)), scalars, max_size=3),
        "objective": st.fixed_dictionaries(
            {"fom": mostly(st.sampled_from(["v", "wall_s"]), st.just("nope"))},
            optional={"direction": mostly(st.sampled_from(["minimize", "maximize"]),
                                          st.just("up"))}),
        "noise_threshold": mostly(st.just(0.05), numbers),
        "unknown_field": scalars,
    }
    for key, strategy in optional.items():
        if draw(one_in(4 if key != "unknown_field" else 20)):
            study[key] = draw(strategy)
    return study


def dump(study: dict[str, Any]) -> str:
    """YAML text of a study (any data yaml can represent; JSON-style otherwise)."""
    try:
        return yaml.safe_dump(study, allow_unicode=True, sort_keys=False)
    except yaml.YAMLError:
        return json.dumps(study, default=str)


_fragments = st.sampled_from([
    "&a ", "*a", "<<: *a\n", "[", "]", "{", "}", ":", "\n  - ", "!!python/object:os.system ",
    "!!binary ", "? ", "|\n", "%YAML 1.1\n", "---\n", "...\n", "\t", "\x00", "\ufeff", "'",
    "\"\\x00\"", "[" * 200, "{a: " * 100, "name: dup\n", "parameters: {}\n", "&b [*b]",
])


@st.composite
def broken_yaml(draw: st.DrawFn) -> str:
    """A study's YAML with fragments inserted and pieces cut out."""
    text = dump(draw(studies()))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()):
            text = text[:at] + draw(_fragments) + text[at:]
        else:
            text = text[:at] + text[at + draw(st.integers(1, 20)):]
    return text
