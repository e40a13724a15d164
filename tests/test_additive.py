"""The additive model's test (:mod:`tunelab.stats.additive`) against the plain least-squares
fit of the whole design matrix, on tables with missing cells and blocks nothing links."""

from __future__ import annotations

import math

import numpy as np

from tunelab.stats.additive import additive_tests
from tunelab.stats.pooled import _two_way


def _design(logs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 0/1 design matrix (a column per point, then per block) and the values of the
    table's finite cells."""
    r, c = np.nonzero(np.isfinite(logs))
    x = np.zeros((r.size, sum(logs.shape)))
    x[np.arange(r.size), r] = 1.0
    x[np.arange(r.size), logs.shape[0] + c] = 1.0
    return x, logs[r, c]


def test_estimates_and_errors_are_the_least_squares_fit_of_the_whole_design():
    rng = np.random.default_rng(5)
    tested = 0
    for trial in range(20):
        points, blocks = 8, 14
        logs = (rng.normal(0, 0.05, points)[:, None] + rng.normal(0, 0.2, blocks)[None, :]
                + rng.normal(0, 0.01, (points, blocks)))
        logs[rng.random((points, blocks)) < 0.45] = np.nan
        logs[:, -1] = np.nan
        logs[3, -1] = 2.0  # a block only point 3 ran: it cannot inform anything
        noise = _two_way(logs)
        assert noise is not None
        x, y = _design(logs)
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        cov = np.linalg.pinv(x.T @ x)
        resid = y - x @ coef
        assert math.isclose(float(resid @ resid) / noise.df, noise.sd_log**2, rel_tol=1e-6)
        tests = additive_tests(logs, 0, range(1, points), noise.sd_log, noise.df, "minimize")
        tested += len(tests)
        for i, t in tests.items():
            c = np.zeros(x.shape[1])
            c[0], c[i] = 1.0, -1.0
            assert math.isclose(t.estimate, float(c @ coef), abs_tol=1e-9), (trial, i)
            assert math.isclose(t.se, math.sqrt(float(c @ cov @ c)) * noise.sd_log,
                                rel_tol=1e-6), (trial, i)
        flipped = additive_tests(logs, 0, list(tests), noise.sd_log, noise.df, "maximize")
        assert all(flipped[i].estimate == -tests[i].estimate for i in tests)
    assert tested >= 100  # of 140: most comparisons take the model


def test_a_point_in_blocks_no_other_point_ran_is_not_estimable():
    logs = np.array([[0.0, 0.1, 0.0, np.nan, np.nan, np.nan],
                     [0.01, 0.11, 0.02, np.nan, np.nan, np.nan],
                     [np.nan, np.nan, np.nan, 0.5, 0.4, 0.45]])
    noise = _two_way(logs)
    assert noise is not None
    assert set(additive_tests(logs, 0, [1, 2], noise.sd_log, noise.df, "minimize")) == {1}
