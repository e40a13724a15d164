"""Hostile files that a study or a command names (beside the study file itself), and paths
the system refuses: each ends in one line naming the file, within the CPU and memory limits.

Found by the re-measurement of stop 46 (``/tmp/inputs/corpus.py``): a pw.x input, a Leopard
data manifest or a bounds profile that is a FIFO blocked for ever, ``/dev/zero`` read without
end, a sparse 2 GB file was read whole (3 GB resident); a pw.x input of 200,000 assignments
took minutes (a line count from the start of the file per assignment); a study directory
name too long for the system was a traceback; a store a newer tunelab wrote was read and
written as if it were this one's.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.hardening.conftest import assert_clean, command_study, finished_two_run_study
from tests.hardening.worker import CliWorker
from tunelab.limits import LIMITS

SI = Path(__file__).parents[2] / "examples" / "qe" / "si.in"
QE = ("name: q\nworkload: {name: qe, options: {input: si.in, oversubscribe: true}}\n"
      "parameters: {np: [1, 2]}\nrepeats: 1\ntimeout: 60\n")
FINGERPRINT = "0123456789ab"


@pytest.fixture(scope="module")
def cli() -> CliWorker:
    """The in-process worker, its bounds and accelerator profiles in each request's
    directory (``b/``, ``acc.yaml``)."""
    env = dict(os.environ, TUNELAB_BOUNDS_DIR="b", TUNELAB_ACCELERATORS="acc.yaml")
    worker = CliWorker(env=env)
    yield worker
    worker.close()


def _make(path: Path, kind: str) -> None:
    """``path`` made a FIFO, a link to /dev/zero, or a sparse file over the size limit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    else:
        with path.open("wb") as f:
            f.truncate(2 << 30)


KINDS = {"fifo": "is not a regular file (a FIFO)",
         "devzero": "is not a regular file (a character device)",
         "sparse": "2,147,483,648 bytes, more than the limit of "}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("consumer", ["qe-input", "leopard-manifest", "bounds-profile"])
def test_a_named_file_that_is_no_regular_file_or_too_large_is_refused_before_it_is_read(
        cli, tmp_path, kind, consumer):
    if consumer == "qe-input":
        (tmp_path / "q.yaml").write_text(QE)
        _make(tmp_path / "si.in", kind)
        argv, fragments = ["space", "q.yaml"], ["q.yaml:2: pw.x input file", "si.in'"]
    elif consumer == "leopard-manifest":
        _make(tmp_path / "g" / "leopard.json", kind)
        argv = ["leopard", "extract", "g", "o", "--window", "1024", "--n-train", "4"]
        fragments = ["g/leopard.json: data manifest"]
    else:
        from tunelab.sysinfo import fingerprint, snapshot

        _make(tmp_path / "b" / f"{fingerprint(snapshot())}.json", kind)
        argv, fragments = ["bounds"], ["bounds profile b/"]
    answer = cli.run({}, argv, timeout_s=60, cwd=str(tmp_path))
    assert_clean(answer, 2, *fragments, KINDS[kind])


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_accelerator_profile_table_that_is_no_regular_file_is_one_line(cli, tmp_path, kind):
    _make(tmp_path / "acc.yaml", kind)
    answer = cli.run({}, ["bench", "ddp", "--compute", "emulate:resnet50/a100/b400",
                          "--steps", "1"], timeout_s=60, cwd=str(tmp_path))
    assert answer["escaped"] is None and answer["rc"] == 2, answer
    lines = answer["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddp: error: accelerator profiles "), lines
    assert KINDS[kind] in lines[0]
    assert answer["cpu_s"] < 5 and answer["maxrss_mb"] < 500


def test_an_accelerator_profile_table_is_read_as_strict_yaml(cli, tmp_path):
    bomb = ["l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    (tmp_path / "acc.yaml").write_text("\n".join(bomb) + "\nprofiles: [*l8]\n")
    answer = cli.run({}, ["bench", "ddp", "--compute", "emulate:resnet50/a100/b400",
                          "--steps", "1"], timeout_s=60, cwd=str(tmp_path))
    assert answer["escaped"] is None and answer["rc"] == 2, answer
    assert "acc.yaml:" in answer["stderr"] and "aliases are expanded" in answer["stderr"]


def test_a_manifest_nested_too_deeply_is_one_line(cli, tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "leopard.json").write_text("[" * 100_000 + "]" * 100_000)
    answer = cli.run({}, ["leopard", "extract", "g", "o", "--window", "1024"],
                     cwd=str(tmp_path))
    assert_clean(answer, 2, "g/leopard.json: data manifest is not valid JSON")


def test_a_pw_input_of_many_assignments_is_read_in_linear_time(cli, tmp_path):
    """200,000 assignments (2.7 MB) in &SYSTEM: minutes before (a line count from the start
    of the text for each one), seconds now."""
    text = SI.read_text().replace("  ibrav = 2", "  ibrav = 2\n" + "".join(
        f"  x{i} = 1\n" for i in range(200_000)))
    answer = cli.run({"q.yaml": QE, "si.in": text}, ["space", "q.yaml"], timeout_s=120)
    assert_clean(answer, 0)


def test_a_sample_that_is_no_regular_file_is_refused_when_the_dataset_is_indexed(tmp_path):
    from tunelab.bench.ddp.dataset import index_dataset
    from tunelab.errors import WorkloadError

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.jpg").write_bytes(b"\xff\xd8")
    os.mkfifo(tmp_path / "a" / "2.jpg")
    with pytest.raises(WorkloadError, match=r"a/2.jpg: not a regular file"):
        index_dataset(tmp_path)


def test_a_dataset_manifest_of_garbage_is_not_read_whole(tmp_path):
    """A cached index that is not one JSON object (a sparse file of zeros) is ignored without
    reading it: the directory is scanned again."""
    import tracemalloc

    from tunelab.bench.ddp.dataset import MANIFEST, index_dataset

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.jpg").write_bytes(b"\xff\xd8")
    with (tmp_path / MANIFEST).open("wb") as f:
        f.truncate(200 << 20)
    tracemalloc.start()
    index = index_dataset(tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert index.samples == 1 and peak < 20 << 20, peak


# --- paths the system refuses -------------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["compare"], ["best"], ["export", "-o", "-"],
                                     ["report"], ["replay", "-o", "r.yaml"]])
def test_a_study_directory_name_too_long_for_the_system_is_one_line(cli, command):
    answer = cli.run({}, [command[0], "d" * 5000, *command[1:]])
    assert_clean(answer, 2, "File name too long")


def test_a_program_whose_name_is_too_long_is_refused_at_its_line(cli):
    answer = cli.run({"s.yaml": command_study(["/" + "p" * 5000])}, ["run", "s.yaml"])
    assert_clean(answer, 2, "s.yaml:", "cannot be reached: File name too long")


# --- a store of a newer tunelab ------------------------------------------------------------

READERS = [["status"], ["compare"], ["best"], ["export", "-o", "-"], ["report"],
           ["replay", "-o", "r.yaml"]]


def test_a_store_a_newer_tunelab_wrote_is_refused_by_every_command_untouched(cli, tmp_path):
    study = tmp_path / "copy"
    shutil.copytree(finished_two_run_study(cli), study)
    db = study / "runs/s/tunelab.db"
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    for command in [*READERS, ["run", "s.yaml", "--repeats", "2"]]:
        target = [] if command[0] == "run" else ["runs/s"]
        answer = cli.run({}, [command[0], *target, *command[1:]], cwd=str(study))
        assert_clean(answer, 2, "tunelab.db: was written by a newer tunelab (results schema "
                                "99; this tunelab knows schemas up to")
    assert db.read_bytes() == before


# --- command-line values that stand in for the study file's --------------------------------


@pytest.mark.parametrize(("option", "fragment"), [
    ("--mem=-5GB", "--mem: must be a size such as 4G or 190GB, got '-5GB'"),
    ("--queue=a b", "--queue: must be one word without spaces, got 'a b'"),
    ("--project=x\ty", "--project: must be one word without spaces"),
    ("--module=", "--module: each entry must be one non-empty line"),
])
def test_a_job_script_option_is_checked_as_the_study_file_s_field_is(cli, option, fragment):
    study = finished_two_run_study(cli)
    answer = cli.run({}, ["script", "runs/s", "-s", "slurm", option], cwd=str(study))
    assert_clean(answer, 2, fragment)


# --- a run that measured nothing ----------------------------------------------------------


@pytest.mark.slow
def test_a_ddp_run_whose_every_sample_is_corrupt_fails_naming_one(tmp_path):
    """Every JPEG empty: the loaders skip them all and the timed steps see no sample; that
    run measured nothing (it printed throughput 0 and exited 0 before)."""
    pytest.importorskip("torchvision")
    from tests.bench.test_ddp_run import bench

    (tmp_path / "d" / "a").mkdir(parents=True)
    for i in range(4):
        (tmp_path / "d" / "a" / f"{i}.jpg").write_bytes(b"")
    proc = bench("--model", "resnet18", "--image-size", "32", "--compute", "emulate:0.01",
                 "--steps", "1", "--warmup", "0", "-b", "2", "--data",
                 f"files:{tmp_path / 'd'}")
    assert proc.returncode == 4, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("ddp: the timed steps received no sample: all "), lines
    assert f"{tmp_path / 'd' / 'a'}/" in lines[-1]
    assert '"benchmark": "ddp"' not in proc.stdout  # no figures of merit to record


# --- a replay study holding values no run records ------------------------------------------


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1.0e+308", "-1.0e-300"])
@pytest.mark.parametrize("command", [["space"], ["run", "--dry-run"], ["run", "-q"]])
def test_a_replayed_value_no_run_records_is_refused_at_its_line(cli, command, value):
    """``tunelab replay`` writes a failed run as null; a NaN, an infinity or a magnitude the
    statistics cannot take would fail every run it is drawn for (or, before, pass ``space``)."""
    text = ("name: r\nworkload: {name: replay, options: {fom: v, points:\n"
            "  [{point: {x: 1}, runs: [1.0, 2.0]},\n"
            f"   {{point: {{x: 2}}, runs: [1.5, {value}]}}]}}}}\n"
            "parameters: {x: [1, 2]}\nrepeats: 2\nbaseline: {x: 1}\n")
    answer = cli.run({"r.yaml": text}, [command[0], "r.yaml", *command[1:]])
    assert_clean(answer, 2, "r.yaml:4:", "'points.1.runs'", "null for a failed run")


@pytest.mark.parametrize("command", [["space"], ["run", "--dry-run"]])
def test_a_pseudopotential_too_large_to_copy_into_every_run_is_refused(cli, tmp_path, command):
    """3 GB of zeros passed space; each run would have copied all of it into its directory."""
    (tmp_path / "pp").mkdir()
    (tmp_path / "si.in").write_text(SI.read_text().replace(
        "pseudo_dir = '/usr/share/espresso/pseudo'", "pseudo_dir = './pp'"))
    with (tmp_path / "pp" / "Si.pz-vbc.UPF").open("wb") as f:
        f.truncate(3 << 30)
    (tmp_path / "q.yaml").write_text(QE)
    answer = cli.run({}, [command[0], "q.yaml", *command[1:]], cwd=str(tmp_path))
    assert_clean(answer, 2, "q.yaml:2: pseudopotential 'Si.pz-vbc.UPF'",
                 "is 3,221,225,472 bytes, more than the limit of 64 MiB")


def test_a_bed_file_of_gigabytes_without_a_line_end_is_refused_at_its_line(cli, tmp_path):
    """labels.narrowPeak extended to 3 GB of zeros: 20 s CPU and 6.2 GB resident before (the
    whole file read as text), one line now."""
    assert_clean(cli.run({}, ["leopard", "synth", "g", "--n-chroms", "3", "--chrom-length",
                              "20000"], cwd=str(tmp_path)), 0)
    labels = tmp_path / "g" / "labels.narrowPeak"
    lines = len(labels.read_text().splitlines())
    with labels.open("r+b") as f:
        f.truncate(3 << 30)
    answer = cli.run({}, ["leopard", "extract", "g", "o", "--window", "1024", "--n-train", "4"],
                     cwd=str(tmp_path))
    assert_clean(answer, 2, f"g/labels.narrowPeak: line {lines + 1} is longer than 65,536 bytes")


@pytest.mark.parametrize("command", [["run", "--dry-run"], ["run"]])
def test_rerun_disturbed_is_bounded_like_repeats(cli, command):
    """--rerun-disturbed 99999999999999999999 was accepted: on a busy machine, where every
    run is flagged disturbed, it would run each run again without end."""
    answer = cli.run({"s.yaml": command_study(["echo", "{x}"])},
                     [*command, "s.yaml", "--rerun-disturbed", "99999999999999999999"])
    assert_clean(answer, 2, "--rerun-disturbed", f"{LIMITS.repeats}")
    assert not Path(answer["dir"], "runs").exists()


@pytest.mark.parametrize("command", [["space"], ["run", "--dry-run"], ["run"]])
@pytest.mark.parametrize(("value", "shown"), [("x * 10", "inf"), ("x * 10 - x * 10", "nan"),
                                              ("-x * 10", "-inf")])
def test_a_derived_value_that_overflows_is_no_value_to_run_with(cli, command, value, shown):
    """x = 1e308, y = x * 10: 'inf' was handed to the program as its argument (exit 0)."""
    text = command_study(["echo", "{y}"], params="x: [1.0e+308]",
                         extra=f'derived: {{y: "{value}"}}\n')
    answer = cli.run({"s.yaml": text}, [command[0], "s.yaml", *command[1:]])
    assert_clean(answer, 2, "s.yaml:", f"gives {shown}: a value that overflowed")


@pytest.mark.parametrize("kind", ["fifo", "devzero", "directory"])
@pytest.mark.parametrize("command", [["run", "-q"], ["status"], ["compare"]])
def test_a_store_that_is_no_regular_file_is_named_by_every_command(cli, tmp_path, kind,
                                                                   command):
    """run said 'disk I/O error' for a FIFO or /dev/zero, the readers 'no tunelab.db'."""
    (tmp_path / "runs" / "s").mkdir(parents=True)
    db = tmp_path / "runs" / "s" / "tunelab.db"
    if kind == "directory":
        db.mkdir()
    else:
        _make(db, kind)
    (tmp_path / "s.yaml").write_text(command_study(["echo", "{x}"]))
    target = ["s.yaml"] if command[0] == "run" else ["runs/s"]
    answer = cli.run({}, [command[0], *target, *command[1:]], timeout_s=60, cwd=str(tmp_path))
    assert_clean(answer, 2, "runs/s: tunelab.db is not a regular file")


@pytest.mark.parametrize("kind", ["fifo", "devzero", "loop"])
def test_a_pseudopotential_or_genome_file_that_is_no_regular_file_is_called_so(cli, tmp_path,
                                                                               kind):
    """Both were reported as missing ('in none of the places searched', 'file not found')."""
    (tmp_path / "si.in").write_text(SI.read_text().replace(
        "pseudo_dir = '/usr/share/espresso/pseudo'", "pseudo_dir = './pp'"))
    (tmp_path / "q.yaml").write_text(QE)
    assert_clean(cli.run({}, ["leopard", "synth", "g", "--n-chroms", "3", "--chrom-length",
                              "20000"], cwd=str(tmp_path)), 0)
    (tmp_path / "g" / "genome.fa").unlink()
    for path in (tmp_path / "pp" / "Si.pz-vbc.UPF", tmp_path / "g" / "genome.fa"):
        if kind == "loop":
            path.parent.mkdir(exist_ok=True)
            path.symlink_to(path.name)
        else:
            _make(path, kind)
    assert_clean(cli.run({}, ["space", "q.yaml"], cwd=str(tmp_path)), 2,
                 "q.yaml:2: pseudopotential 'Si.pz-vbc.UPF'", "is not a regular file")
    assert_clean(cli.run({}, ["leopard", "extract", "g", "o", "--window", "1024"],
                         cwd=str(tmp_path)), 2, "g/genome.fa: fasta is not a regular file")
