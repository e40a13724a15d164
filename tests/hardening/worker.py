"""A long-lived process that runs the real ``tunelab`` command line in-process, one request
at a time, under resource limits, and measures each request.

Starting Python and importing tunelab costs about a second per command; fuzzing hundreds of
study files through separate processes would take minutes. The worker pays it once. Each
request is ``{"files": {name: text}, "argv": [...]}``: the files are written into a fresh
directory, the worker changes into it and calls :func:`tunelab.cli.main` exactly as the
console script does (``sys.argv`` set, standard streams captured, ``SystemExit`` taken as the
exit status). The answer holds the exit status, both streams, the CPU seconds and wall
seconds the request took, the process's peak RSS during it, and the traceback of any exception
that escaped ``main`` (which must never happen).

The process runs under ``RLIMIT_AS`` (address space) and ``RLIMIT_CPU``, so a runaway input
ends the worker instead of the machine; the client (:class:`CliWorker`) then reports it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ADDRESS_SPACE_BYTES = 3 << 30  # generous: numpy/torch map large regions they never touch
CPU_SECONDS = 600


def _stream() -> io.TextIOWrapper:
    """A captured text stream with a ``buffer`` (as ``sys.stdout`` has)."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="replace")


def _text(stream: io.TextIOWrapper, keep: int = 20_000) -> str:
    stream.flush()
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode(errors="replace")[-keep:]


def _reset_peak_rss() -> None:
    """Start this request's peak RSS at the current RSS (``VmHWM``; ``ru_maxrss`` would
    also hold the RSS of the pytest process this worker was forked from)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_rss_mb() -> float:
    """Peak resident memory of this process (since the last reset), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _serve() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    from tunelab.cli import main  # import once, before the first request

    out = sys.stdout
    root = Path(tempfile.mkdtemp(prefix="tunelab-worker-"))
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for n, line in enumerate(sys.stdin):
        request = json.loads(line)
        workdir = Path(request["cwd"]) if request.get("cwd") else root / f"r{n}"
        workdir.mkdir(exist_ok=True)
        for name, text in request["files"].items():
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
            (workdir / name).write_text(text)
        os.chdir(workdir)
        stdout, stderr = _stream(), _stream()
        sys.argv = ["tunelab", *request["argv"]]
        escaped = None
        rc: Any = 0
        _reset_peak_rss()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main()
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - reported to the test, which fails
                escaped = traceback.format_exc()
                rc = None
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        answer = {
            "rc": rc, "stdout": _text(stdout), "stderr": _text(stderr),
            "cpu_s": time.process_time() - cpu0,
            "children_cpu_s": (children.ru_utime + children.ru_stime
                               - children0.ru_utime - children0.ru_stime),
            "wall_s": time.perf_counter() - wall0,
            "maxrss_mb": _peak_rss_mb(),
            "escaped": escaped, "dir": str(workdir),
        }
        os.chdir(root)
        out.write(json.dumps(answer) + "\n")
        out.flush()


class WorkerDied(RuntimeError):
    """The worker ended (killed by a resource limit, or crashed) while answering."""


class CliWorker:
    """Client of one worker process: ``run(files, argv)`` -> the answer dict."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self._env = env
        self._proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.hardening.worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[2], env=self._env)
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        if not ready:
            raise WorkerDied(f"worker did not start: {proc.stderr.read() if proc.stderr else ''}")
        return proc

    def run(self, files: dict[str, str], argv: list[str], timeout_s: float = 120,
            cwd: str | None = None) -> dict[str, Any]:
        """Run ``tunelab ARGV`` with ``files`` in a fresh working directory (or in ``cwd``,
        the ``dir`` of an earlier answer)."""
        if self._proc is None or self._proc.poll() is not None:
            self._proc = self._start()
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"files": files, "argv": argv, "cwd": cwd}) + "\n")
        proc.stdin.flush()
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                self.close()
                raise WorkerDied(f"no answer within {timeout_s} s to tunelab {argv}")
        line = proc.stdout.readline()
        if not line:
            rc = proc.wait()
            err = proc.stderr.read()[-2000:] if proc.stderr else ""
            self._proc = None
            raise WorkerDied(f"worker ended with status {rc} on tunelab {argv}: {err}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        """End the worker."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


if __name__ == "__main__":
    _serve()
