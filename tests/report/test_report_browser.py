"""The HTML report in a real browser (headless Chromium) at desktop and phone widths.

A probe script added to a copy of the report measures the layout after Chromium rendered it:
the page must never scroll sideways; wide tables scroll inside their own boxes; plots scale
to the page. Skipped, with the reason, where Chromium is not installed (scripts/setup.sh
installs Debian's ``chromium``).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tunelab.report import results_from_frame, write_report
from tunelab.workload import Objective

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed "
                                "(apt-get install chromium; scripts/setup.sh does it as root)")

PROBE = """<script>(function () {
  const page = document.documentElement;
  const right = (el) => Math.ceil(el.getBoundingClientRect().right);
  document.body.setAttribute("data-probe", JSON.stringify({
    viewport: window.innerWidth, page: page.scrollWidth,
    images: Array.from(document.images).map(right),
    boxes: Array.from(document.querySelectorAll(".scroll")).map(
      (b) => ({right: right(b), scroll: b.scrollWidth, client: b.clientWidth}))}));
})();</script>"""


def layout(report: Path, width: int, tmp_path: Path) -> dict:
    probed = tmp_path / f"probe-{width}.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    assert CHROMIUM is not None
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={width},900", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120).stdout
    match = re.search(r'data-probe="([^"]*)"', dom)
    assert match, f"Chromium printed no probe result: {dom[:300]!r}"
    return json.loads(html.unescape(match.group(1)))


@pytest.fixture
def wide_report(runs_factory, tmp_path: Path) -> Path:
    """A report whose table is far wider than a phone: long point labels, many columns."""
    long_env = "UCX_TLS=tcp,self,sysv,posix,cma_with_a_rather_long_name"
    runs = runs_factory({long_env: (1.0, 4, []), "baseline": (1.1, 4, []),
                         "x" * 60: (1.3, 4, ["failed"])}, seed=1)
    results = results_from_frame(runs, Objective("wall_s", "minimize"),
                                 json.dumps({"env": "baseline", "np": 2}, sort_keys=True),
                                 name="phone")
    return write_report(results, tmp_path / "report.html")


@pytest.mark.parametrize("width", [1400, 500])
def test_report_never_scrolls_sideways_and_plots_fit(wide_report, width, tmp_path):
    found = layout(wide_report, width, tmp_path)
    assert found["viewport"] == width
    assert found["page"] <= width, found
    assert found["images"] and all(r <= width for r in found["images"]), found
    assert found["boxes"] and all(b["right"] <= width for b in found["boxes"]), found
    if width == 500:  # the ranked table is wider than a phone: it scrolls in its own box
        assert found["boxes"][0]["scroll"] > found["boxes"][0]["client"], found
