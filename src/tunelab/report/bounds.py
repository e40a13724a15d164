"""What ``tunelab bounds`` shows: a machine's measured limits as a :class:`View`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tunelab.report.output import SCHEMA_VERSION, Cell, Column, Lines, TextTable, View

if TYPE_CHECKING:
    from tunelab.bounds.profile import Bound, Profile

__all__ = ["bounds_view", "rate_text"]

_ORDER = ("gemm", "memory", "link", "storage")


def rate_text(value: float, unit: str) -> str:
    """``441.6 GFLOP/s``, ``3.21 GB/s`` (10^9), ``812 MB/s`` (10^6) below 1 GB/s."""
    if unit == "FLOP/s":
        return f"{value / 1e12:,.2f} TFLOP/s" if value >= 1e13 else f"{value / 1e9:,.1f} GFLOP/s"
    return f"{value / 1e9:,.2f} GB/s" if value >= 1e9 else f"{value / 1e6:,.0f} MB/s"


def _machine_text(machine: Any) -> str:
    from tunelab.sysinfo import isa_summary

    cpu = str(machine.get("cpu_model") or "unknown CPU")
    isa = isa_summary(machine.get("cpu_isa") or [])
    parts = [f"{cpu} {isa}" if isa else cpu,
             f"{machine.get('logical_cores')} cores", f"{machine.get('memory_gib')} GiB"]
    if machine.get("gpu"):
        parts.append(str(machine["gpu"]))
    return f"{machine.get('host')} ({', '.join(parts)})"


def bounds_view(profile: Profile, *, path: str = "", measured_now: bool = True) -> View:
    """The bounds of ``profile``, one row each: what, the value (the median of its samples),
    the best sample, how many, and how it was measured."""
    from tunelab.bounds.match import bound_label

    rows: list[dict[str, Cell]] = []
    records = []
    for b in sorted(profile.bounds, key=lambda b: _ORDER.index(b.kind)):
        rows.append({"kind": b.kind, "what": bound_label(b), "value": rate_text(b.value, b.unit),
                     "best": rate_text(b.best, b.unit), "n": str(len(b.samples)),
                     "method": b.method + (f"; BUSY: measured while {b.disturbed}"
                                           if b.disturbed else "")})
        records.append(_record(b))
    load = " -> ".join(f"{x:.2f}" for x in profile.loadavg)
    how = "quick" if profile.quick else "thorough"
    title = (f"bounds of {_machine_text(profile.machine)}, measured {profile.taken_at} ({how}, "
             f"{profile.seconds:g} s, load average {load}); machine {profile.fingerprint}")
    columns = (Column("kind", "kind"), Column("what", "bound", wrap=True),
               Column("value", "median", "right"), Column("best", "best", "right", drop=2),
               Column("n", "n", "right", drop=1), Column("method", "how", wrap=True, drop=3))
    notes = list(profile.notes)
    if not profile.bounds:
        notes.append("No bound was measured.")
    kept = f"kept in {path}; " if path else ""
    again = ("tunelab bounds --refresh measures again" if measured_now else
             "stored earlier: tunelab bounds --refresh measures again")
    table = TextTable(title, columns, tuple(rows), tuple(notes))
    document = {"schema": "tunelab.bounds", "version": SCHEMA_VERSION,
                "fingerprint": profile.fingerprint, "machine": dict(profile.machine),
                "taken_at": profile.taken_at, "quick": profile.quick,
                "seconds": profile.seconds, "loadavg": list(profile.loadavg),
                "path": path or None, "measured_now": measured_now,
                "bounds": [b.to_dict() for b in profile.bounds], "notes": notes}
    return View((table, Lines((f"{kept}{again}",))), document, tuple(records), _FIELDS)


_VARIANT = ("precision", "device", "threads", "stack", "pattern", "ranks", "nodes",
            "message_bytes", "directory", "cache")
_FIELDS = ("kind", *_VARIANT, "value", "unit", "best", "n", "method")


def _record(b: Bound) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": b.kind}
    record.update({k: b.variant.get(k) for k in _VARIANT})
    record.update(value=b.value, unit=b.unit, best=b.best, n=len(b.samples), method=b.method)
    return record
