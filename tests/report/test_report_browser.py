"""The HTML report in a real browser (headless Chromium) at desktop and phone widths.

A probe script added to a copy of the report measures the layout after Chromium rendered it:
the page must never scroll sideways; on a phone (390 px) every row of the ranked table is a
card whose speedup, interval, p and verdict are on screen without scrolling; the plots' tick
labels stay at least 9 px tall as shown (their size in the PNG, recorded in its metadata,
scaled by the width Chromium shows it at); on a desktop (1400 px) a point's label takes at
most two lines. Skipped, with the reason, where Chromium is not installed (scripts/setup.sh
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

PROBE = """<script>function probe(frame) {
  const doc = frame.contentDocument, win = frame.contentWindow;
  const page = doc.documentElement;
  const right = (el) => Math.ceil(el.getBoundingClientRect().right);
  const rect = (el) => { const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, width: r.width, height: r.height}; };
  const lines = (el) => Math.round(el.getBoundingClientRect().height /
                                   parseFloat(win.getComputedStyle(el).lineHeight));
  const ranked = doc.getElementById("ranked");
  document.body.setAttribute("data-probe", JSON.stringify({
    viewport: win.innerWidth, page: page.scrollWidth,
    images: Array.from(doc.images).map(right),
    shown: Array.from(doc.images).map(
      (i) => ({alt: i.alt, natural: i.naturalWidth, width: i.getBoundingClientRect().width})),
    boxes: Array.from(doc.querySelectorAll(".scroll")).map(
      (b) => ({right: right(b), scroll: b.scrollWidth, client: b.clientWidth})),
    ranked_box: ranked && {scroll: ranked.parentElement.scrollWidth,
                           client: ranked.parentElement.clientWidth},
    keys: ranked ? Array.from(ranked.querySelectorAll("td.key")).map(
      (td) => ({key: td.dataset.key, text: td.textContent.trim(), ...rect(td),
                visible: win.getComputedStyle(td).display !== "none"})) : [],
    points: ranked ? Array.from(ranked.querySelectorAll("td.point")).map(
      (td) => ({text: td.textContent.trim(), lines: lines(td)})) : []}));
}</script>"""


def layout(report: Path, width: int, tmp_path: Path) -> dict:
    """The probe's measurements of ``report`` shown in a viewport ``width`` px wide.

    The report is shown in an ``<iframe srcdoc>`` of that width (its own viewport: media
    queries and layout see ``width``; a headless window cannot be narrower than 500 px), and
    the page around it measures it once it has loaded."""
    wrapper = tmp_path / f"probe-{width}.html"
    wrapper.write_text(
        f"<!DOCTYPE html><html><head>{PROBE}</head><body style='margin:0'>"
        f"<iframe style='border:0' width='{width}' height='900' onload='probe(this)' "
        f"srcdoc=\"{html.escape(report.read_text(), quote=True)}\"></iframe></body></html>")
    assert CHROMIUM is not None
    dom = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={max(width, 500) + 40},1000", "--dump-dom", wrapper.as_uri()],
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


@pytest.mark.parametrize("width", [1400, 500, 390])
def test_report_never_scrolls_sideways_and_plots_fit(wide_report, width, tmp_path):
    found = layout(wide_report, width, tmp_path)
    assert found["viewport"] == width
    assert found["page"] <= width, found
    assert found["images"] and all(r <= width for r in found["images"]), found
    assert found["boxes"] and all(b["right"] <= width for b in found["boxes"]), found


@pytest.mark.parametrize("width", [390, 500])
def test_on_a_phone_speedup_ci_p_and_verdict_are_on_screen(wide_report, width, tmp_path):
    found = layout(wide_report, width, tmp_path)
    box = found["ranked_box"]
    assert box["scroll"] <= box["client"], found  # cards: nothing to scroll to
    keys = found["keys"]
    assert {k["key"] for k in keys} == {"speedup", "p", "verdict"}
    for cell in keys:
        if not cell["text"]:  # the baseline has no p
            continue
        assert cell["visible"] and cell["width"] > 0, cell
        assert cell["left"] >= 0 and cell["right"] <= width, (cell, width)
    speedups = [k["text"] for k in keys if k["key"] == "speedup"]
    assert any("[" in text and "×" in text for text in speedups), speedups  # the interval too


def _min_tick_px(report: Path) -> dict[str, float]:
    """alt text -> the smallest tick label's font size in the PNG's own pixels, as the
    plotting code recorded it in the image's metadata."""
    import base64
    import io

    from PIL import Image

    sizes = {}
    for alt, data in re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]+)"',
                                report.read_text()):
        text = Image.open(io.BytesIO(base64.b64decode(data))).text
        if "tunelab:min-tick-px" in text:
            sizes[html.unescape(alt)] = float(text["tunelab:min-tick-px"])
    return sizes


def test_on_a_phone_the_plots_tick_labels_stay_legible(wide_report, tmp_path):
    found = layout(wide_report, 390, tmp_path)
    sizes = _min_tick_px(wide_report)
    assert {"report speedup", "report runs"} <= set(sizes), sizes
    shown = {image["alt"]: image for image in found["shown"]}
    for alt, px in sizes.items():
        image = shown[alt]
        rendered = px * image["width"] / image["natural"]
        assert rendered >= 9.0, (alt, px, image, rendered)


def test_on_a_desktop_a_point_takes_at_most_two_lines(wide_report, tmp_path):
    found = layout(wide_report, 1400, tmp_path)
    points = found["points"]
    assert points and all(p["lines"] <= 2 for p in points), points
    short = [p for p in points if len(p["text"]) <= 40]
    assert short and all(p["lines"] == 1 for p in short), short
    keys = found["keys"]
    assert all(k["right"] <= 1400 for k in keys), keys
