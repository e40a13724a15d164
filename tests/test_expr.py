from __future__ import annotations

import pytest

from tunelab.expr import Expression, ExpressionError


@pytest.mark.parametrize(
    ("source", "values", "expected"),
    [
        ("np % npool == 0", {"np": 4, "npool": 2}, True),
        ("np % npool == 0", {"np": 4, "npool": 3}, False),
        ("is_square(ndiag) and ndiag <= np // npool", {"ndiag": 4, "np": 8, "npool": 2}, True),
        ("is_square(ndiag)", {"ndiag": 2}, False),
        ("is_pow2(n)", {"n": 64}, True),
        ("is_pow2(n)", {"n": 48}, False),
        ("1 <= x < 3", {"x": 3}, False),
        ("a if b else c", {"a": 1, "b": False, "c": 2}, 2),
        ("mode in ('am', 'get_zcopy')", {"mode": "am"}, True),
        ("np * omp <= cores", {"np": 2, "omp": 2, "cores": 2}, False),
        ("max(a, b) - min(a, b)", {"a": 3, "b": 7}, 4),
    ],
)
def test_expressions_evaluate_like_python(source, values, expected):
    assert Expression.parse(source).evaluate(values) == expected


def test_names_exclude_function_names():
    assert Expression.parse("is_square(ndiag) and np > 1").names == {"ndiag", "np"}


@pytest.mark.parametrize(
    "source",
    ["__import__('os').system('true')", "x.__class__", "x[0]", "[i for i in x]",
     "open('/etc/passwd')", "lambda: 1", "(x := 1)", "f'{x}'"],
)
def test_unsafe_expressions_are_refused_at_parse_time(source):
    with pytest.raises(ExpressionError):
        Expression.parse(source)


def test_huge_exponent_is_refused():
    with pytest.raises(ExpressionError, match="exponent"):
        Expression.parse("2 ** x").evaluate({"x": 10**6})


def test_unknown_name_and_division_by_zero_are_expression_errors():
    with pytest.raises(ExpressionError, match="unknown name 'y'"):
        Expression.parse("y + 1").evaluate({})
    with pytest.raises(ExpressionError, match="failed"):
        Expression.parse("1 // x").evaluate({"x": 0})


@pytest.mark.parametrize("source", ["(-1) ** 0.5", "abs(x ** 0.5)", "(x ** 0.5) == 0",
                                    "x ** 1.5 > 0 or True"])
def test_a_complex_number_is_an_evaluation_error_wherever_it_appears(source):
    with pytest.raises(ExpressionError, match=r"is a complex number \(a negative number to a "
                                              r"fractional power\)"):
        Expression.parse(source).evaluate({"x": -4})


@pytest.mark.parametrize(("source", "kind"), [("(1, 2)", "tuple"), ("None", "NoneType"),
                                              ("x if x > 9 else None", "NoneType")])
def test_a_value_that_is_no_number_string_or_boolean_is_an_error(source, kind):
    with pytest.raises(ExpressionError, match=f"gives .*, a {kind}: an expression's value must "
                                              "be a number, string or boolean"):
        Expression.parse(source).evaluate({"x": 1})


@pytest.mark.parametrize(("source", "expected"), [("x ** 0.5", 2.0), ("x in (4, 5)", True),
                                                  ("'a' * 2", "aa"), ("not x", False)])
def test_real_numbers_strings_and_booleans_are_values(source, expected):
    assert Expression.parse(source).evaluate({"x": 4}) == expected
