"""Address exchange through a directory (a local temporary one, or a shared file system).

Worker ``r`` writes ``addr-r.json`` atomically; the others poll for it until a deadline.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["publish", "wait_for"]


def publish(directory: str | Path, rank: int, info: dict[str, Any]) -> None:
    """Write worker ``rank``'s address record (write to a temporary name, then rename)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".addr-{rank}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, d / f"addr-{rank}.json")


def wait_for(directory: str | Path, rank: int, deadline: float) -> dict[str, Any] | None:
    """Worker ``rank``'s record, or None when ``deadline`` (``time.monotonic``) passes."""
    path = Path(directory) / f"addr-{rank}.json"
    delay = 0.005
    while True:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
