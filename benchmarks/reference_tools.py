"""What the benchmarks that judge tunelab against reference tools share: the CPU's name for
their headers (tunelab's own), and ``ucx_perftest`` (UCX's own bandwidth test) between two
local processes. Imported by ``bounds_vs_reference.py`` and ``merge_vs_peers.py`` (run from
this folder)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tunelab.sysinfo import cpu_model  # noqa: E402  (the CPU's name, as studies record it)

__all__ = ["cpu_model", "ucx_perftest"]


def ucx_perftest(size: int, port: int) -> float | None:
    """``ucx_perftest -t tag_bw`` (one way, streaming) of ``size``-byte messages between two
    local processes, bytes/s (UCX's MB is 2^20 bytes); None where it is not installed or
    printed no result."""
    if shutil.which("ucx_perftest") is None:
        print("  - ucx_perftest not installed (apt-get install ucx-utils); skipped")
        return None
    server = subprocess.Popen(["ucx_perftest", "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)  # the server listening
        proc = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", str(port), "-t", "tag_bw",
                               "-s", str(size), "-n", "200", "-w", "20"],
                              capture_output=True, text=True, timeout=300)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait(timeout=30)
    m = re.search(r"^Final:\s+\d+\s+\S+\s+\S+\s+\S+\s+([\d.]+)", proc.stdout, re.M)
    return float(m.group(1)) * (1 << 20) if m else None
