"""A third-party workload found through the ``tunelab.workloads`` entry point, end to end:
the example in ``examples/plugin`` registered by a real distribution's metadata."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import PY, env_with_pythonpath

PLUGIN = Path(__file__).parents[2] / "examples" / "plugin"


def test_plugin_workload_is_listed_initialised_and_run(tmp_path: Path) -> None:
    # what `pip install ./examples/plugin` leaves behind: a dist-info with the entry point
    dist = tmp_path / "site" / "tunelab_sortplugin-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tunelab-sortplugin\n"
                                   "Version: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[tunelab.workloads]\n"
                                           "sort = tunelab_sort:SortWorkload\n")
    env = env_with_pythonpath(tmp_path / "site", PLUGIN)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PY, "-m", "tunelab", *args], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=120)

    listed = json.loads(cli("workloads", "--format", "json").stdout)["workloads"]
    sort = next(w for w in listed if w["name"] == "sort")
    assert sort["available"] and "plugin example" in sort["description"]
    assert cli("init", "sort").returncode == 0
    study = tmp_path / "sort-study.yaml"
    study.write_text(study.read_text().replace("repeats: 3", "repeats: 1"))
    ran = cli("run", str(study), "--dir", "d")
    assert ran.returncode == 0, ran.stderr
    best = json.loads(cli("best", "d", "--format", "json").stdout)
    assert best["objective"]["fom"] == "sort_s" and best["best"]["point"]["n"] == 10_000
