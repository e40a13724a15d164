"""A tiny real program for runner tests: behaves according to its first argument."""

import json
import os
import random
import subprocess
import sys
import time

mode, x = sys.argv[1], float(sys.argv[2])
if mode == "ok":
    print(f"progress value=0\nvalue={x * 2}")
elif mode == "json":
    print(json.dumps({"score": x * 10, "note": "text is ignored"}))
elif mode == "crash":
    print("something broke badly", file=sys.stderr)
    sys.exit(3)
elif mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.environ["PIDFILE"], "w") as f:
        f.write(str(child.pid))
    time.sleep(120)
elif mode == "garbage":
    print("no figure of merit here")
elif mode == "slow":
    time.sleep(float(os.environ.get("SLOW_S", "0.4")))
    print(f"value={x}")
elif mode == "options":  # each of OPT_A / OPT_B set to "fast" saves 0.15 s of 0.4 s
    # the work's own time, with 1% noise: independent of how busy the machine is
    saved = sum(0.15 for v in ("OPT_A", "OPT_B") if os.environ.get(v) == "fast")
    work_s = (0.4 - saved) * random.uniform(0.99, 1.01)
    time.sleep(work_s / 4)
    print(f"value={x} work_s={work_s:.6f}")
elif mode == "env":
    print(f"value={len(os.environ.get('TUNELAB_TEST_VAR', ''))}")
else:
    sys.exit(f"unknown mode {mode}")
