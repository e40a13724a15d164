"""The merge benchmark (MPI) and Leopard (torchrun + DDP) across two virtual Slurm nodes."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import tunelab
from tests.execute.test_slurm_launcher import runs

pytestmark = pytest.mark.slow


def test_merge_mpi_and_dask_span_two_nodes(write_study, slurm_env, tmp_path):
    pytest.importorskip("mpi4py")
    pytest.importorskip("distributed")
    path = write_study("""
        name: merge-2n
        workload:
          name: merge
          options: {mpi_pml: ob1, chunk_size: 5000, iterations: 1, warmup: 0}
        parameters: {transport: [mpi, dask], workers: [2], nodes: [2]}
        repeats: 1
        timeout: 300
        launcher: {type: slurm, mode: pack, starter: mpirun, cores_per_node: 2,
                   poll_interval: 0.5s, site: virtual}
        """)
    d = tmp_path / "d"
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    by_transport = {json.loads(r["params"])["transport"]: r for r in runs(d)}
    assert all(r["status"] == "ok" for r in by_transport.values()), by_transport
    mpi, dask = by_transport["mpi"], by_transport["dask"]
    assert (d / mpi["run_dir"] / "hostfile").read_text() == "node1 slots=1\nnode2 slots=1\n"
    command = json.loads(mpi["command"])
    assert "--hostfile" in command and "--mpi-arg=--bind-to" in command
    # the Dask workers registered from both virtual nodes' addresses
    log = (d / dask["run_dir"] / "stderr.txt").read_text()
    workers = set(re.findall(r"Register worker addr: tcp://([0-9.]+):", log))
    assert len(workers) == 2 and {w.rsplit(".", 1)[1] for w in workers} == {"1", "2"}


def test_leopard_ddp_trains_across_two_nodes(write_study, slurm_env, tmp_path):
    pytest.importorskip("torch")
    from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic
    from tunelab.leopard.windows import extract_windows

    manifest = write_synthetic(tmp_path / "synth", SyntheticConfig(
        n_chroms=4, chrom_length=16_000, site_spacing=1_000, seed=1))
    # 16 eval windows: the first 8 of this genome hold no bound base, which training refuses
    extract_windows(manifest, tmp_path / "win", window=512, n_train=16, max_eval=16, seed=0)
    path = write_study(f"""
        name: leopard-2n
        workload:
          name: leopard
          options: {{data: {tmp_path / "win"}, window: 512, epochs: 1, steps_per_epoch: 1,
                    threads: 1, batch_size: 4, max_eval_windows: 16}}
        parameters: {{nodes: [2], ppn: [1]}}
        repeats: 1
        timeout: 300
        launcher: {{type: slurm, cores_per_node: 2, poll_interval: 0.5s}}
        """)
    d = tmp_path / "d"
    res = tunelab("run", path, "--dir", d, "-q")
    assert res.returncode == 0, res.stderr
    (run,) = runs(d)
    assert run["status"] == "ok", run["reason"]
    foms = json.loads((d / run["run_dir"] / "stdout.txt").read_text().strip().splitlines()[-1])
    assert foms["world_size"] == 2 and foms["global_batch"] == 8
    command = json.loads(run["command"])
    assert command[:2] == ["srun", "--nodes=2"] and "tunelab.cluster.nodeenv" in command
