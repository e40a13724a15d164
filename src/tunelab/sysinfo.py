"""A snapshot of the machine and software a study ran on, stored with its runs."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import psutil

__all__ = ["cpu_model", "fingerprint", "machine_identity", "mem_available", "snapshot"]

KEY_PACKAGES = ("tunelab", "numpy", "scipy", "pandas", "torch", "mpi4py", "dask",
                "distributed", "ucxx", "optuna")
DEFAULT_TOOLS: dict[str, list[str]] = {
    "mpirun": ["mpirun", "--version"],
    "ucx_info": ["ucx_info", "-v"],
    "gcc": ["gcc", "--version"],
    "nvidia-smi": ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else the platform's (``unknown`` if none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_available() -> int:
    """Bytes of memory available to new work without swapping (the kernel's MemAvailable:
    free memory plus the page cache it can drop)."""
    return int(psutil.virtual_memory().available)


def _package_versions(names: Sequence[str]) -> dict[str, str]:
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _tool_version(argv: Sequence[str]) -> str | None:
    """The first line a tool's version probe prints, or None. The probe runs in a private
    temporary directory with stdin from /dev/null: a tool run bare may read stdin or leave
    files behind (pw.x writes ``CRASH`` and ``input_tmp.in``), and the user's cwd stays clean."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="tunelab-probe-") as scratch:
            out = subprocess.run(list(argv), capture_output=True, text=True, timeout=10,
                                 stdin=subprocess.DEVNULL, cwd=scratch)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (out.stdout + out.stderr).splitlines():
        if line.strip():
            # a banner's date is not part of the version ("Program PWSCF v.6.7MaX starts on …")
            return re.sub(r"\s+starts on .*$", "", line.strip())
    return None


def snapshot(extra_tools: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """CPU model, cores, memory, OS, Python, key package and tool versions."""
    tools = {**DEFAULT_TOOLS, **(extra_tools or {})}
    tool_versions = {name: v for name, argv in tools.items()
                     if (v := _tool_version(argv)) is not None}
    return {
        "host": socket.gethostname(),
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "packages": _package_versions(KEY_PACKAGES),
        "tools": tool_versions,
        "loadavg": list(os.getloadavg()),
    }


def machine_identity(snap: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a :func:`snapshot` that name the machine itself (host, CPU model, cores,
    memory, GPU), without what changes from run to run (load, versions)."""
    gpu = str((snap.get("tools") or {}).get("nvidia-smi") or "").split(",")[0].strip()
    memory = snap.get("memory_gib")
    return {"host": snap.get("host"), "cpu_model": snap.get("cpu_model"),
            "logical_cores": snap.get("logical_cores"),
            "physical_cores": snap.get("physical_cores"),
            "memory_gib": round(float(memory)) if isinstance(memory, int | float) else None,
            "gpu": gpu or None}


def fingerprint(snap: Mapping[str, Any]) -> str:
    """A short stable name of the machine a :func:`snapshot` was taken on (12 hex digits of
    the hash of :func:`machine_identity`): the key of its measured bounds."""
    text = json.dumps(machine_identity(snap), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
