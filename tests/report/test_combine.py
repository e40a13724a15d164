"""``tunelab combine``: the env sets it leaves out, said in one line however many there are."""

from __future__ import annotations

from tunelab.report.combine import left_out_text


def test_a_few_env_sets_left_out_are_each_named_with_their_verdict() -> None:
    assert left_out_text([("useless", "indistinguishable"), ("bad", "slower")]) == (
        "useless (indistinguishable), bad (slower)")
    assert left_out_text([]) == ""


def test_many_env_sets_left_out_are_counted_by_verdict_in_one_line() -> None:
    """The field test's 301-set study printed one stderr line per set left out (240 lines);
    now one line counts them by verdict and names the first few of each."""
    left = [(f"opt{i}", "indistinguishable") for i in range(230)]
    left += [(f"bad{i}", "slower") for i in range(10)]
    text = left_out_text(left)
    assert text == ("230 indistinguishable (opt0, opt1, opt2 and 227 more), "
                    "10 slower (bad0, bad1, bad2 and 7 more)")
    assert "\n" not in text
