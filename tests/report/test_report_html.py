"""The HTML report is one self-contained, escaped file."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pandas as pd

from tunelab.report import table_rows, write_html_report
from tunelab.stats import best, compare_to_baseline, summarize
from tunelab.workload import Objective

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _report(
    runs: pd.DataFrame, objective: Objective, tmp_path: Path, baseline: str, injected: str
) -> tuple[str, list]:
    from tunelab.report import speedup_bar_chart

    comparisons = compare_to_baseline(runs, "wall_s", "minimize", baseline)
    image = speedup_bar_chart(comparisons, tmp_path / "speedup.png", objective=objective)
    path = write_html_report(
        tmp_path / "report.html",
        title=f"study {injected}",
        study_spec={"workload": {"name": "command", "argv": ["echo", injected]}},
        sysinfo={"cpu": "Test CPU", "packages": {"numpy": "2.4"}},
        summaries=summarize(runs, "wall_s"),
        comparisons=comparisons,
        best=best(runs, "wall_s", "minimize"),
        images=[image],
        runs=runs,
        objective=objective,
    )
    return path.read_text(encoding="utf-8"), comparisons


def test_html_is_self_contained(
    runs: pd.DataFrame, objective: Objective, tmp_path: Path, baseline: str, injected: str
) -> None:
    html, _ = _report(runs, objective, tmp_path, baseline, injected)
    # the embedded PNGs' base64 may spell "hTtP" by chance: look outside them
    assert "http" not in re.sub(r"base64,[A-Za-z0-9+/=]+", "", html).lower()
    assert "<link" not in html and "@import" not in html
    sources = re.findall(r'src="([^"]*)"', html)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    png = base64.b64decode(sources[0].removeprefix("data:image/png;base64,"))
    assert png[:8] == PNG_MAGIC and png == (tmp_path / "speedup.png").read_bytes()


def test_html_holds_table_values_failures_and_snapshot(
    runs: pd.DataFrame, objective: Objective, tmp_path: Path, baseline: str, injected: str
) -> None:
    html, comparisons = _report(runs, objective, tmp_path, baseline, injected)
    for row in table_rows(comparisons, objective):
        for cell in (row.n, row.mean_std, row.median, row.verdict):
            assert f">{cell}<" in html
        parts = row.speedup.split("; ")  # each interval in a span of its own
        for i, part in enumerate(parts):
            assert f'<span class="part">{part}{";" if i < len(parts) - 1 else ""}</span>' \
                in html
    assert html.index('id="verdict"') < html.index('id="table"') < html.index('id="plots"')
    assert "Best point: env=am np=2" in html
    assert "Runs that were not ok (4)" in html
    assert "failed: rank 1 said &lt;boom&gt; &amp; died" in html
    assert "Test CPU" in html and "numpy" in html


def test_html_escapes_injected_values(
    runs: pd.DataFrame, objective: Objective, tmp_path: Path, baseline: str, injected: str
) -> None:
    html, _ = _report(runs, objective, tmp_path, baseline, injected)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html


def test_html_table_names_the_test_behind_its_p_column(
    runs: pd.DataFrame, objective: Objective, tmp_path: Path, baseline: str, injected: str
) -> None:
    html, comparisons = _report(runs, objective, tmp_path, baseline, injected)
    tests = sorted({pc.comparison.test for pc in comparisons if not pc.is_baseline
                    and pc.comparison.p_adjusted == pc.comparison.p_adjusted})
    assert f"<th>p ({' / '.join(tests)}; adjusted: Holm)</th>" in html
    assert "<th>detectable</th>" in html and "Mann" not in html and "bootstrap" not in html
    for row in table_rows(comparisons, objective):  # escaped: <0.001 is &lt;0.001
        cell = row.p_value.replace("<", "&lt;")
        assert f'data-key="p" data-label="p ({tests[0]}' in html
        assert f">{cell}</td>" in html or row.verdict_kind == "baseline"
