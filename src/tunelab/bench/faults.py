"""The ``--inject-fault`` text every benchmark shares: ``key=value`` pairs joined by commas."""

from __future__ import annotations

from collections.abc import Collection

from tunelab.errors import WorkloadError

__all__ = ["fault_fields"]


def fault_fields(text: str, allowed: Collection[str]) -> dict[str, str]:
    """``rank=1,action=kill`` as ``{"rank": "1", "action": "kill"}``; a pair without ``=`` or
    a key outside ``allowed`` is a one-line :class:`WorkloadError`."""
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep:
            raise WorkloadError(f"--inject-fault: expected key=value, got {item!r}")
        fields[key.strip()] = value.strip()
    unknown = set(fields) - set(allowed)
    if unknown:
        raise WorkloadError(f"--inject-fault: unknown field(s) {sorted(unknown)}")
    return fields
