"""``tunelab export``: every run of a study as CSV, Parquet or JSON, to a file or stdout.

CSV and Parquet hold the flat runs table (one column per parameter and per figure of merit,
``fom.<name>``), and the environment each run was started with as one JSON-encoded column,
``run_env`` (:func:`with_run_env`). JSON holds one object per run with the point as an
object, the figures of merit under ``foms`` and the environment under ``env`` — never JSON
inside a string. A Parquet column holds one type: a
column whose values have none in common (a parameter ``[1, fast]``) or an integer beyond
64 bits is written as strings (:func:`parquet_frame`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from tunelab.errors import TunelabError
from tunelab.report.output import json_safe

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ENV_COLUMN", "export_runs", "parquet_frame", "run_records", "with_run_env"]

ENV_COLUMN = "run_env"
"""The flat table's column of a run's environment (``env`` names a study's env set)."""

_RUN_FIELDS = ("run_id", "repeat", "status", "reason", "rc", "wall_s", "started_at",
               "ended_at", "host")


def run_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """One JSON-ready object per run: its fields, ``point`` as an object, ``foms``, and
    ``env`` as an object when ``frame`` has :data:`ENV_COLUMN` (:func:`with_run_env`)."""
    return list(_iter_records(frame))


def with_run_env(frame: pd.DataFrame, envs: Mapping[int, str]) -> pd.DataFrame:
    """``frame`` with :data:`ENV_COLUMN` after ``host``: each run's environment
    (``envs``: run id -> the stored JSON object of its variables) as JSON text with sorted
    names (``{"OMP_NUM_THREADS": "2"}``, ``{}`` when nothing was set; a stored value that is
    not a JSON object is kept as it is). A parameter of that name becomes
    ``param.run_env``."""
    out = frame.rename(columns={ENV_COLUMN: f"param.{ENV_COLUMN}"})
    texts = [_env_text(envs.get(int(run_id))) for run_id in frame["run_id"]]
    at = out.columns.get_loc("host") + 1 if "host" in out.columns else len(out.columns)
    out.insert(int(at), ENV_COLUMN, texts)
    return out


def _env_text(stored: str | None) -> str | None:
    try:
        env = json.loads(stored) if stored is not None else None
    except (ValueError, RecursionError):  # a damaged store's text
        return stored
    if not isinstance(env, dict):
        return stored
    return json.dumps(env, sort_keys=True, ensure_ascii=False)


def _iter_records(frame: pd.DataFrame, chunk: int = 1000) -> Iterator[dict[str, Any]]:
    rows = (row for start in range(0, len(frame), chunk)
            for row in frame.iloc[start:start + chunk].to_dict("records"))
    for row in rows:
        record: dict[str, Any] = {"run_id": row.get("run_id"), "point": json.loads(row["point"])}
        record.update({k: row.get(k) for k in _RUN_FIELDS if k != "run_id"})
        record["foms"] = {k.removeprefix("fom."): v for k, v in row.items()
                          if k.startswith("fom.") and v == v and v is not None}
        if ENV_COLUMN in row:
            record["env"] = _env_object(row[ENV_COLUMN])
        yield json_safe(record)


def _env_object(text: str | None) -> Any:
    """The environment of :func:`with_run_env`'s column as an object (text that is not
    one, from a damaged store, as it is)."""
    try:
        return json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        return text


def _write_json_runs(path: Path | None, frame: pd.DataFrame) -> None:
    """The runs as one JSON array, written run by run (byte for byte what ``json.dumps`` of
    the whole list with ``indent=1`` writes), so that a large study is never held as one
    string: 20,000 runs took 367 MB that way."""
    with _opened(path) as out:
        first = True
        for record in _iter_records(frame):
            text = json.dumps(record, indent=1, ensure_ascii=False, allow_nan=False)
            out.write(("[\n " if first else ",\n ") + text.replace("\n", "\n "))
            first = False
        out.write("[]\n" if first else "\n]\n")


def export_runs(directory: Path, fmt: str, path: Path | None) -> int:
    """Write the runs of ``directory`` in ``fmt`` to ``path`` (stdout when None); return how
    many runs were written."""
    from tunelab.store import open_store

    with open_store(directory) as store:
        frame = with_run_env(store.runs_frame(), store.run_envs())
    try:
        if fmt == "json":
            _write_json_runs(path, frame)
        elif fmt == "csv":
            with _opened(path) as out:
                frame.to_csv(out, index=False)
        elif fmt == "parquet":
            table = parquet_frame(frame)
            if path is None:
                sys.stdout.flush()
                table.to_parquet(sys.stdout.buffer, index=False)
                sys.stdout.buffer.flush()
            else:
                table.to_parquet(path, index=False)
        else:
            raise TunelabError(f"unknown export format {fmt!r}; valid: csv, parquet, json")
    except OSError as exc:
        raise TunelabError(f"cannot write {path or 'standard output'}: "
                           f"{exc.strerror or exc}") from None
    return len(frame)


def parquet_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each column Parquet cannot hold as one type written as strings.

    A study's parameter may list values of several types (``[1, fast]``, ``[0, true]``) or
    integers beyond 64 bits (``99999999999999999999``): pyarrow refuses such a column, so
    its values become their text (``'1'``, ``'fast'``; missing values stay null). Other
    columns keep their types."""
    import pyarrow as pa  # on use: only the parquet export needs it

    out = frame.copy()
    for column in frame.columns:
        if frame[column].dtype != object:
            continue
        try:
            pa.array(frame[column], from_pandas=True)
        except (pa.ArrowException, OverflowError):
            out[column] = frame[column].map(_as_text).astype(object)
    return out


def _as_text(value: Any) -> str | None:
    """``value`` as text for a string column; None for a missing value (None or NaN)."""
    return None if value is None or value != value else str(value)


@contextmanager
def _opened(path: Path | None) -> Iterator[TextIO]:
    """``path`` opened for writing text (standard output when None, flushed at the end)."""
    if path is None:
        yield sys.stdout
        sys.stdout.flush()
    else:
        with path.open("w") as out:
            yield out
