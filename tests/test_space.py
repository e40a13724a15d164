from __future__ import annotations

import itertools
import math

import pytest

from tunelab.errors import SpaceError
from tunelab.expr import Expression
from tunelab.space import Point, Space
from tunelab.spec import ConstraintSpec


def rules(*sources: str) -> list[ConstraintSpec]:
    return [ConstraintSpec(Expression.parse(s)) for s in sources]


def qe_space() -> Space:
    return Space(
        [("np", (1, 2, 4, 8)), ("npool", (1, 2, 3, 4, 8)), ("ndiag", (1, 2, 4, 9))],
        derived={"rpp": Expression.parse("np // npool")},
        constraints=rules("np % npool == 0", "is_square(ndiag)", "ndiag <= rpp"),
    )


def brute_force(space: Space) -> set[Point]:
    names = space.names
    found = set()
    for combo in itertools.product(*(a.values for a in space.axes)):
        p = Point(dict(zip(names, combo, strict=True)))
        scope = {**space.constants, **p}
        scope["rpp"] = scope["np"] // scope["npool"]
        if all(c.expr.evaluate(scope) for c in space.constraints):
            found.add(p)
    return found


def test_enumeration_equals_brute_force_and_excludes_are_accounted():
    space = qe_space()
    summary, points = space.summarize()
    assert set(points) == brute_force(space)
    assert len(points) == len(set(points)) == summary.valid
    assert summary.valid + sum(summary.excluded.values()) == summary.total == 4 * 5 * 4
    assert set(summary.excluded) == {"np % npool == 0", "is_square(ndiag)", "ndiag <= rpp"}


def test_pruning_counts_whole_subtrees():
    # npool=3 never divides np: that prunes 4 ndiag values per np at once
    summary, _ = qe_space().summarize()
    assert summary.excluded["np % npool == 0"] % 4 == 0


def test_contains_and_reasons():
    space = qe_space()
    assert space.contains({"np": 4, "npool": 1, "ndiag": 4})
    assert space.why_not({"np": 2, "npool": 3, "ndiag": 1}) == "violates 'np % npool == 0'"
    assert space.why_not({"np": 2, "npool": 1, "ndiag": 4}) == "violates 'ndiag <= rpp'"
    assert "missing ndiag" in space.why_not({"np": 2, "npool": 1})
    assert "is not one of" in space.why_not({"np": 3, "npool": 1, "ndiag": 1})


def test_points_are_canonical_and_hashable():
    a = Point({"np": 2, "npool": 1})
    b = Point({"npool": 1, "np": 2})
    assert a == b and hash(a) == hash(b) and a.key == b.key == '{"np": 2, "npool": 1}'
    assert Point.from_key(a.key) == a
    assert len({a, b}) == 1


def test_values_include_derived_and_sampling_is_valid_and_seeded():
    space = qe_space()
    assert space.values(Point({"np": 8, "npool": 2, "ndiag": 4}))["rpp"] == 4
    sample = space.sample(5, seed=1)
    assert len(set(sample)) == 5 and all(space.contains(p) for p in sample)
    assert sample == space.sample(5, seed=1)


def test_large_space_is_not_materialised():
    # 10^8 combinations; a constraint on the first axis prunes all but one value early
    axes = [(f"p{i}", tuple(range(10))) for i in range(8)]
    space = Space(axes, constraints=rules("p0 == 0", "p1 == 0", "p2 == 0", "p3 == 0",
                                          "p4 == 0", "p5 < 2"))
    summary, points = space.summarize()
    assert summary.total == 10**8 and summary.valid == 2 * 100
    assert summary.excluded["p0 == 0"] == 9 * 10**7
    assert math.isclose(sum(summary.excluded.values()) + summary.valid, 10**8)


def test_empty_space_is_an_error_naming_the_constraint():
    space = Space([("x", (1, 2))], constraints=rules("x > 5"))
    with pytest.raises(SpaceError, match=r"no valid point: all 2 combinations are excluded "
                                         r"\('x > 5' excluded 2\)"):
        space.points()


def test_unknown_name_in_constraint():
    with pytest.raises(SpaceError, match="unknown name 'npol'"):
        Space([("np", (1,))], constraints=rules("np % npol == 0"))


@pytest.mark.parametrize(("value", "text"), [
    (0, "x=0"), ("0", "x='0'"), (1.5, "x=1.5"), ("1.5", "x='1.5'"), ("1e3", "x='1e3'"),
    (True, "x=True"), ("True", "x='True'"), ("None", "x='None'"), ("", "x=''"),
    ("a b", "x='a b'"), ("fast", "x=fast"), ("nan", "x='nan'"), ("v1", "x=v1"),
])
def test_a_label_tells_a_string_that_reads_as_another_value_apart(value, text):
    from tunelab.report.formats import point_label

    assert Point({"x": value}).label() == text
    assert point_label({"x": value}) == text  # the reports write the same


def test_an_int_and_a_string_of_the_same_digits_label_differently():
    labels = {Point({"x": v}).label() for v in (0, "0", 0.0, False)}
    assert len(labels) == 4


def test_a_rule_that_cannot_be_evaluated_says_why_and_where_it_first_failed():
    """A derived value that gives None somewhere left those points out with no reason."""
    space = Space([("source", ("x", "y", "z")), ("n", (1, 2, 3))],
                  derived={"limit": Expression.parse("'150MB/s' if source == 'x' else None")},
                  constraints=rules("n // (n - 2) >= -1"))
    summary, points = space.summarize()
    assert [p["source"] for p in points] == ["x", "x"]
    assert summary.excluded == {"limit": 6, "n // (n - 2) >= -1": 1}
    assert set(summary.broken) == {"limit", "n // (n - 2) >= -1"}
    assert "derived value 'limit' cannot be computed" in summary.broken["limit"]
    assert "gives None" in summary.broken["limit"]
    assert summary.broken["limit"].endswith("(first at source='y')")
    assert summary.broken["n // (n - 2) >= -1"].endswith("(first at source='x', n=2)")
    assert space.broken == summary.broken


def test_a_rule_that_only_fails_is_not_broken():
    summary, _ = qe_space().summarize()
    assert summary.broken == {}


def positive_size(name, value):
    """A program that takes only a positive ``size`` (as a workload's check_parameter)."""
    return "a value the program never takes: must be > 0" if name == "size" and value <= 0 \
        else None


def test_a_derived_value_the_program_never_takes_is_no_point_of_the_space():
    """Such combinations were points whose every run failed at command build."""
    space = Space([("a", (1, 2, 3, 4)), ("b", (1, 2))],
                  derived={"size": Expression.parse("3 - a")}, refuses=positive_size)
    summary, points = space.summarize()
    assert sorted({p["a"] for p in points}) == [1, 2]
    assert summary.valid == 4 and summary.excluded == {"size": 4}
    assert summary.broken == {"size": "derived value 'size' is 0, a value the program never "
                                      "takes: must be > 0 (first at a=3)"}
    assert space.broken == summary.broken and space.left_out == {"size": 4}
    assert not space.contains({"a": 4, "b": 1})
    assert space.why_not({"a": 4, "b": 1}) == ("derived value 'size' is -1, a value the "
                                               "program never takes: must be > 0")
    assert all(space.contains(p) for p in points)


def test_a_derived_value_the_program_never_takes_anywhere_leaves_no_point():
    space = Space([("a", (3, 4))], derived={"size": Expression.parse("3 - a")},
                  refuses=positive_size)
    with pytest.raises(SpaceError) as info:
        space.points()
    assert str(info.value) == (
        "no valid point: all 2 combinations are excluded ('size' excluded 2); the first "
        "combination (a=3): derived value 'size' is 0, a value the program never takes: "
        "must be > 0")
    assert info.value.subject == ("derived", "size")


def test_sampling_a_space_too_large_to_enumerate_says_what_a_derived_value_left_out():
    space = Space([("a", tuple(range(1, 401))), ("b", tuple(range(400)))],
                  derived={"size": Expression.parse("300 - a")}, refuses=positive_size)
    assert not space.enumerable
    points = space.sample(50, seed=1)
    assert len(points) == 50 and all(p["a"] < 300 for p in points)
    assert space.broken["size"].startswith("derived value 'size' is ")
    assert space.left_out == {}  # not counted: the space was not enumerated


def test_a_space_is_enumerated_once():
    space = qe_space()
    first, points = space.summarize()
    points.clear()
    first.excluded.clear()
    again, points_again = space.summarize()
    assert again.excluded and len(points_again) == again.valid == len(space.points())


def test_a_space_too_large_to_enumerate_estimates_what_its_rules_leave_out():
    """Sampling recorded why a derived value left combinations out, never how many: 'tunelab
    run' said 'combinations are left out where …' without a count, 'tunelab space' nothing."""
    space = Space([("a", tuple(range(1, 401))), ("b", tuple(range(400)))],
                  derived={"size": Expression.parse("300 - a")}, refuses=positive_size)
    estimate = space.estimate()
    assert estimate.drawn == 1000 and estimate.total == 160_000
    assert estimate.valid + estimate.excluded["size"] == 1000
    assert 0.20 < estimate.share(estimate.excluded["size"]) < 0.30  # 101 of 400 values of a
    assert estimate.estimated(estimate.excluded["size"]) == (
        f"about {round(estimate.excluded['size'] / 10)}% (an estimate: "
        f"{estimate.excluded['size']} of 1,000 drawn at random)")
    assert estimate.about(0) == "under 0.3%"
    assert space.broken["size"].startswith("derived value 'size' is ")
    assert space.estimate() == estimate  # drawn once
    assert space.left_out == {} and space.valid_count is None  # still not counted


def test_sampling_a_sparse_space_records_the_most_points_it_found():
    """The bound a study caps its planned runs by: no strategy proposes more points than
    the sampling it draws them by found."""
    space = Space([("a", tuple(range(1000))), ("b", tuple(range(1000)))],
                  constraints=rules("a < 30 and b < 30"))  # 900 of 1,000,000
    assert space.sampled_most == 0
    points = space.sample(100, seed=0)
    assert 0 < len(points) < 100 and space.sampled_most == len(points)


def test_a_point_of_no_parameters_has_one_label_wherever_it_is_said():
    """'(default)' was written twice, by report/formats.py point_label and by the executor's
    and the progress line's ``point.label() or '(default)'``; Point.label said ''."""
    from tunelab.execute.runner import RunEvent
    from tunelab.report.formats import point_label
    from tunelab.report.progress import event_line

    assert Point({}).label() == "(default)" == point_label({})
    for params in ({"np": 2, "env": "am"}, {"x": "0"}):
        assert point_label(params) == Point.label_of(params)
    assert Point({"b": 1, "a": "0"}).label() == "a='0' b=1"
    assert event_line(RunEvent(Point({}), 0, "ok", None, 1, 2, 0.5)) == \
        "[1/2] (default) r0 ok 0.50 s"
