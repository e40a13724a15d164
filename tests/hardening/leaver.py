"""A run that leaves processes behind: ``leaver.py MODE SLEEP TAG X``.

Every process it starts has TAG on its command line (the tests find them by it). Modes:
``both`` a ``setsid()`` grandchild and a background child; ``all`` those plus one started
with an empty environment in a new session. Both first check that no tagged process of an
earlier run is still alive (exit 3 if one is: a run started beside a survivor);
``stubborn`` ignores SIGTERM, and so do its leftovers; ``fill`` writes 0.7 MB of output.
Then it sleeps SLEEP seconds and prints ``v=X``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

mode, sleep, tag, x = sys.argv[1:5]
PY = sys.executable
LINGER = f"import signal, time; {{}}time.sleep(300)  # {tag}"


def tagged_others() -> list[int]:
    me = os.getpid()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if int(pid) != me and tag.encode() in cmd and state != "Z":
            found.append(int(pid))
    return found


if mode in ("both", "all") and tagged_others():
    print(f"leftovers of an earlier run are alive: {tagged_others()}", file=sys.stderr)
    sys.exit(3)
ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if mode == "stubborn" else ""
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode in ("both", "all", "stubborn"):
    subprocess.Popen([PY, "-c", LINGER.format(ignore)], start_new_session=True)
    subprocess.Popen([PY, "-c", LINGER.format(ignore)])
if mode == "all":
    subprocess.Popen(["env", "-i", "setsid", PY, "-c", LINGER.format("")])
if mode == "fill":
    sys.stdout.write("x" * 700_000 + "\n")
time.sleep(float(sleep))
print(f"v={x}")
