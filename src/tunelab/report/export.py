"""``tunelab export``: every run of a study as CSV, Parquet or JSON, to a file or stdout.

CSV and Parquet hold the flat runs table (one column per parameter and per figure of merit,
``fom.<name>``). JSON holds one object per run with the point as an object and the figures
of merit under ``foms`` — never JSON inside a string.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunelab.errors import TunelabError
from tunelab.report.output import json_safe

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["export_runs", "run_records"]

_RUN_FIELDS = ("run_id", "repeat", "status", "reason", "rc", "wall_s", "started_at",
               "ended_at", "host")


def run_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """One JSON-ready object per run: its fields, ``point`` as an object, ``foms``."""
    records = []
    for row in frame.to_dict("records"):
        record: dict[str, Any] = {"run_id": row.get("run_id"), "point": json.loads(row["point"])}
        record.update({k: row.get(k) for k in _RUN_FIELDS if k != "run_id"})
        record["foms"] = {k.removeprefix("fom."): v for k, v in row.items()
                          if k.startswith("fom.") and v == v and v is not None}
        records.append(json_safe(record))
    return records


def export_runs(directory: Path, fmt: str, path: Path | None) -> int:
    """Write the runs of ``directory`` in ``fmt`` to ``path`` (stdout when None); return how
    many runs were written."""
    from tunelab.store import open_store

    with open_store(directory) as store:
        frame = store.runs_frame()
    try:
        if fmt == "json":
            text = json.dumps(run_records(frame), indent=1, ensure_ascii=False,
                              allow_nan=False) + "\n"
            _write(path, text)
        elif fmt == "csv":
            _write(path, frame.to_csv(index=False))
        elif fmt == "parquet":
            if path is None:
                sys.stdout.flush()
                frame.to_parquet(sys.stdout.buffer, index=False)
                sys.stdout.buffer.flush()
            else:
                frame.to_parquet(path, index=False)
        else:
            raise TunelabError(f"unknown export format {fmt!r}; valid: csv, parquet, json")
    except OSError as exc:
        raise TunelabError(f"cannot write {path or 'standard output'}: "
                           f"{exc.strerror or exc}") from None
    return len(frame)


def _write(path: Path | None, text: str) -> None:
    if path is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        path.write_text(text)
