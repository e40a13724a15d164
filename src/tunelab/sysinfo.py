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

__all__ = ["cpu_isa", "cpu_model", "fingerprint", "isa_summary", "machine_identity",
           "mem_available", "mem_total", "snapshot"]

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


_ISA = re.compile(r"(sse4_2|avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*|sve\w*|asimd\w*)")


def cpu_isa(cpuinfo: str | None = None) -> list[str]:
    """The vector instruction sets the CPU offers (``avx2``, ``fma``, ``avx512f``,
    ``avx512_bf16``, ``amx_tile``, …), sorted, from the flags of /proc/cpuinfo (or the text
    given); empty where none are listed. Machines sold under one model name differ here
    (one with AVX-512 BF16, another with AVX2 only), and so do their limits."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            flags = line.split(":", 1)[1].split()
            return sorted({f for f in flags if _ISA.fullmatch(f)})
    return []


def isa_summary(flags: Sequence[str]) -> str:
    """The widest vector instructions among ``flags`` in words: ``AVX-512 BF16``,
    ``AVX2``, … (empty when none is known)."""
    have = set(flags)
    if any(f.startswith("avx512") for f in have):
        text = "AVX-512" + (" BF16" if "avx512_bf16" in have else "")
    elif "avx2" in have:
        text = "AVX2"
    elif "avx" in have:
        text = "AVX"
    elif any(f.startswith("sve") for f in have):
        text = "SVE"
    elif any(f.startswith("asimd") for f in have):
        text = "ASIMD"
    else:
        return ""
    return text + (" AMX" if any(f.startswith("amx") for f in have) else "")


def mem_available() -> int:
    """Bytes of memory available to new work without swapping (the kernel's MemAvailable:
    free memory plus the page cache it can drop)."""
    return int(psutil.virtual_memory().available)


def mem_total() -> int:
    """Bytes of physical memory (the kernel's MemTotal)."""
    return int(psutil.virtual_memory().total)


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
        "cpu_isa": cpu_isa(),
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
    """The fields of a :func:`snapshot` that name the machine itself (host, CPU model and
    its vector instruction sets, cores, memory, GPU), without what changes from run to run
    (load, versions). A snapshot taken before the instruction sets were recorded keeps the
    identity (and fingerprint) it had."""
    gpu = str((snap.get("tools") or {}).get("nvidia-smi") or "").split(",")[0].strip()
    memory = snap.get("memory_gib")
    identity = {"host": snap.get("host"), "cpu_model": snap.get("cpu_model"),
                "logical_cores": snap.get("logical_cores"),
                "physical_cores": snap.get("physical_cores"),
                "memory_gib": round(float(memory)) if isinstance(memory, int | float) else None,
                "gpu": gpu or None}
    if "cpu_isa" in snap:
        identity["cpu_isa"] = sorted(str(f) for f in snap.get("cpu_isa") or [])
    return identity


def fingerprint(snap: Mapping[str, Any]) -> str:
    """A short stable name of the machine a :func:`snapshot` was taken on (12 hex digits of
    the hash of :func:`machine_identity`): the key of its measured bounds."""
    text = json.dumps(machine_identity(snap), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
