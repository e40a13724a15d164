"""A machine's measured limits: :class:`Bound` records in a :class:`Profile`, kept per machine.

A profile is one JSON file per machine in :func:`profile_dir` (``$TUNELAB_BOUNDS_DIR``, else
``~/.cache/tunelab/bounds``), named by the machine's fingerprint
(:func:`tunelab.sysinfo.fingerprint`: host, CPU model and vector instruction sets, cores,
memory, GPU), so a study finds
the bounds of the machine its snapshot names. Measuring again replaces the bounds of the same
identity (kind and variant) and keeps the others.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tunelab.errors import TunelabError
from tunelab.inputfile import read_input_text

__all__ = ["BOUND_KINDS", "PROFILE_SCHEMA", "Bound", "BoundKind", "Profile", "median_of",
           "load_profile",
           "profile_dir", "profile_path", "save_profile"]

BoundKind = Literal["gemm", "memory", "link", "storage"]
BOUND_KINDS: tuple[BoundKind, ...] = ("gemm", "memory", "link", "storage")
PROFILE_SCHEMA = "tunelab.bounds"
_VERSION = 1
ENV_DIR = "TUNELAB_BOUNDS_DIR"

_UNITS = {"gemm": "FLOP/s", "memory": "B/s", "link": "B/s", "storage": "B/s"}


@dataclass(frozen=True)
class Bound:
    """One measured limit of the machine.

    ``kind``: ``gemm`` (FLOP/s of a large matrix product), ``memory`` (bytes/s of a
    STREAM-style triad), ``link`` (bytes/s one rank sends to others) or ``storage`` (bytes/s
    read from a directory). ``variant`` says which (gemm: ``precision``, ``device``,
    ``threads``; memory: ``device``, ``threads``; link: ``stack`` (``mpi-ob1``, ``mpi-ucx``,
    ``tcp``), ``pattern`` (``oneway``: ping-pong; ``bothways``: pairs send to each other at
    once; ``alltoall``: every rank to every other at once), ``ranks``, ``nodes``,
    ``message_bytes``; storage: ``directory``, ``cache`` (``cold`` or ``warm``)).
    ``value`` is the median of ``samples``, each sample a timed block of its own: on a
    shared machine the best block is luck (both ranks of a link happened to have a core),
    and a study's means are judged against what the machine gives, not against its luckiest
    moment; ``best`` keeps the largest sample. ``method`` says how it was measured;
    ``disturbed`` what other processes took meanwhile when that was enough to lower it
    (the noise watch's evidence, e.g. ``others took 64% of cores 0-1``; "" when quiet).
    """

    kind: BoundKind
    variant: Mapping[str, Any]
    value: float
    samples: tuple[float, ...] = ()
    method: str = ""
    disturbed: str = ""

    @property
    def unit(self) -> str:
        """``FLOP/s`` or ``B/s``."""
        return _UNITS[self.kind]

    @property
    def identity(self) -> tuple[str, str]:
        """What a newer measurement of the same limit replaces: kind and variant."""
        return self.kind, json.dumps(dict(self.variant), sort_keys=True, default=str)

    @property
    def best(self) -> float:
        """The largest sample (the value without samples)."""
        return max(self.samples, default=self.value)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"kind": self.kind, "variant": dict(self.variant), "value": self.value,
                "unit": self.unit, "best": self.best, "samples": list(self.samples),
                "method": self.method, "disturbed": self.disturbed or None}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Bound:
        """Read the JSON form (a :class:`TunelabError` line when it is not one)."""
        try:
            kind = doc["kind"]
            value = float(doc["value"])
            variant = dict(doc.get("variant") or {})
            samples = tuple(float(x) for x in doc.get("samples") or ())
        except (KeyError, TypeError, ValueError) as exc:
            raise TunelabError(f"a stored bound is malformed ({exc!r})") from None
        if kind not in BOUND_KINDS or not math.isfinite(value) or value <= 0:
            raise TunelabError(f"a stored bound is malformed (kind {kind!r}, value {value!r})")
        return cls(kind, variant, value, samples, str(doc.get("method") or ""),
                   str(doc.get("disturbed") or ""))


@dataclass(frozen=True)
class Profile:
    """The bounds of one machine: ``machine`` (its identity, :func:`machine_identity`),
    ``fingerprint`` (the file's name), when and how quickly they were measured, the load
    average before and after, and notes (what was skipped and why)."""

    fingerprint: str
    machine: Mapping[str, Any]
    taken_at: str
    bounds: tuple[Bound, ...]
    quick: bool = False
    loadavg: tuple[float, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[Bound]:
        """The bounds of one kind, in stored order."""
        return [b for b in self.bounds if b.kind == kind]

    def merged(self, newer: Profile) -> Profile:
        """``newer`` with this profile's bounds that ``newer`` did not measure again."""
        renewed = {b.identity for b in newer.bounds}
        kept = tuple(b for b in self.bounds if b.identity not in renewed)
        return Profile(newer.fingerprint, newer.machine, newer.taken_at, kept + newer.bounds,
                       newer.quick, newer.loadavg, newer.notes, newer.seconds, newer.extra)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (``schema`` ``tunelab.bounds``)."""
        return {"schema": PROFILE_SCHEMA, "version": _VERSION, "fingerprint": self.fingerprint,
                "machine": dict(self.machine), "taken_at": self.taken_at, "quick": self.quick,
                "loadavg": list(self.loadavg), "seconds": self.seconds,
                "notes": list(self.notes), "bounds": [b.to_dict() for b in self.bounds],
                **({"extra": dict(self.extra)} if self.extra else {})}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Profile:
        """Read the JSON document (a :class:`TunelabError` line when it is not one)."""
        if doc.get("schema") != PROFILE_SCHEMA:
            raise TunelabError(f"not a bounds profile (schema {doc.get('schema')!r})")
        if doc.get("version") != _VERSION:
            raise TunelabError(f"bounds profile version {doc.get('version')!r} is not "
                               f"{_VERSION}: measure again with tunelab bounds --refresh")
        bounds = doc.get("bounds")
        if not isinstance(bounds, list):
            raise TunelabError("a bounds profile without a list of bounds")
        return cls(str(doc.get("fingerprint") or ""), dict(doc.get("machine") or {}),
                   str(doc.get("taken_at") or ""), tuple(Bound.from_dict(b) for b in bounds),
                   bool(doc.get("quick")), tuple(float(x) for x in doc.get("loadavg") or ()),
                   tuple(str(n) for n in doc.get("notes") or ()),
                   float(doc.get("seconds") or 0.0), dict(doc.get("extra") or {}))


def profile_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where profiles are kept: ``$TUNELAB_BOUNDS_DIR``, else ``~/.cache/tunelab/bounds``."""
    env = os.environ if environ is None else environ
    given = env.get(ENV_DIR)
    return Path(given).expanduser() if given else Path.home() / ".cache" / "tunelab" / "bounds"


def profile_path(fingerprint: str, directory: Path | None = None) -> Path:
    """The file of the machine ``fingerprint``."""
    if not fingerprint or not fingerprint.isalnum():
        raise TunelabError(f"invalid machine fingerprint {fingerprint!r}")
    return (directory or profile_dir()) / f"{fingerprint}.json"


def load_profile(fingerprint: str, directory: Path | None = None) -> Profile | None:
    """The stored profile of machine ``fingerprint``, or None when it has none."""
    path = profile_path(fingerprint, directory)
    if not os.path.lexists(path):
        return None
    text = read_input_text(path, f"bounds profile {path}")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise TunelabError(f"{path} is not JSON ({exc}); measure again with "
                           "tunelab bounds --refresh") from None
    if not isinstance(doc, dict):
        raise TunelabError(f"{path} is not a bounds profile")
    try:
        return Profile.from_dict(doc)
    except TunelabError as exc:
        raise TunelabError(f"{path}: {exc}") from None


def save_profile(profile: Profile, directory: Path | None = None) -> Path:
    """Write ``profile`` atomically (a temporary file renamed over the old one)."""
    path = profile_path(profile.fingerprint, directory)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".bounds-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(profile.to_dict(), fh, indent=2, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise TunelabError(f"cannot write the bounds profile {path}: {exc.strerror or exc}; "
                           f"set {ENV_DIR} to a writable directory") from None
    return path


def median_of(samples: Iterable[float]) -> float:
    """The median of the finite positive samples (NaN when there is none)."""
    good = sorted(s for s in samples if math.isfinite(s) and s > 0)
    if not good:
        return math.nan
    mid = len(good) // 2
    return good[mid] if len(good) % 2 else (good[mid - 1] + good[mid]) / 2
