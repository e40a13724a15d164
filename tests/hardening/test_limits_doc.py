"""The user guide's table of limits is the one in force (``tunelab.limits.LIMITS``)."""

from __future__ import annotations

import re
from pathlib import Path

from tunelab.limits import describe

GUIDE = Path(__file__).parents[2] / "docs" / "user-guide.md"


def test_the_user_guide_lists_every_limit_with_its_value():
    text = GUIDE.read_text()
    section = text[text.index("### Limits"):]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, re.MULTILINE))
    assert rows == {name: shown for name, shown, _ in describe()}
