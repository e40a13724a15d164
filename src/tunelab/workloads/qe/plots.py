"""Plots of a pw.x study (PNG, matplotlib's Agg backend, imported only when drawing).

Input is the engine's runs table (one row per run; parameters as columns ``np``, ``npool``,
``ndiag``…; figures of merit as ``fom.<name>``; ``point`` holds the point's canonical JSON).
The data steps (:func:`scaling_table`, :func:`ndiag_table`, :func:`timer_table`) return
plain DataFrames and are tested without drawing; :func:`np_figure` and :func:`ndiag_figure`
draw them (legends beside the axes, never over a line) and :func:`plot_qe_study` writes the
PNGs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MAIN_TIMERS",
    "ndiag_figure",
    "ndiag_table",
    "np_figure",
    "plot_qe_study",
    "scaling_table",
    "timer_bars",
    "timer_table",
]

#: Non-overlapping top-level pw.x timers stacked in the breakdown (the rest is "other").
MAIN_TIMERS = ("init_run", "c_bands", "sum_band", "v_of_rho", "newd", "mix_rho", "forces",
               "stress")
_PARAMS = ("np", "npool", "ndiag", "ntg", "omp", "env")


def _key(point: str | dict[str, Any]) -> str:
    obj = json.loads(point) if isinstance(point, str) else point
    return json.dumps(obj, sort_keys=True)


def _metric(runs: pd.DataFrame, metric: str | None) -> str:
    """The FOM column to plot: ``metric`` if given, else pw.x's wall time, else ``wall_s``."""
    names = (metric,) if metric else ("fom.pwscf_wall_s", "fom.wall_s")
    for name in names:
        if name in runs.columns and runs[name].notna().any():
            return name
    raise ValueError(f"the runs table has no values for {' or '.join(names)}")


def _ok(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] == "ok"] if "status" in runs.columns else runs


def _per_point(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per point: its parameters, mean/std/n of ``metric``."""
    params = [p for p in _PARAMS if p in runs.columns]
    grouped = runs.groupby("point", sort=False)
    stats = grouped[metric].agg(["mean", "std", "count"]).rename(columns={"count": "n"})
    first = grouped[params].first()
    out = first.join(stats).reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out


def _best_per(table: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    idx = table.groupby(list(keys))["mean"].idxmin()
    return table.loc[idx].sort_values(list(keys)).reset_index(drop=True)


def scaling_table(runs: pd.DataFrame, metric: str | None = None) -> pd.DataFrame:
    """Wall time vs np, one series per npool: for each (npool, np) the best point over the
    other parameters; columns ``npool, np, mean, std, n, point``."""
    metric = _metric(runs, metric)
    table = _per_point(_ok(runs).dropna(subset=[metric]), metric)
    keys = [k for k in ("npool", "np") if k in table.columns]
    if "np" not in keys:
        raise ValueError("the runs table has no 'np' column")
    return _best_per(table, keys)


def ndiag_table(runs: pd.DataFrame, metric: str | None = None) -> pd.DataFrame:
    """Wall time vs ndiag, one series per (np, npool): the best point over the other
    parameters; columns ``np, npool, ndiag, mean, std, n, point``."""
    metric = _metric(runs, metric)
    table = _per_point(_ok(runs).dropna(subset=[metric]), metric)
    if "ndiag" not in table.columns:
        raise ValueError("the runs table has no 'ndiag' column")
    keys = [k for k in ("np", "npool", "ndiag") if k in table.columns]
    return _best_per(table, keys)


def timer_table(runs: pd.DataFrame, points: Sequence[str], labels: Sequence[str],
                timers: Sequence[str] = MAIN_TIMERS) -> pd.DataFrame:
    """Mean wall seconds of the main pw.x timers (plus ``other`` = PWSCF wall minus their
    sum) for each of ``points`` (JSON keys), indexed by ``labels``."""
    runs = _ok(runs)
    keys = runs["point"].map(_key)
    if len(points) != len(labels):
        raise ValueError("timer_table needs one label per point")
    rows = []
    for point in points:
        sel = runs[keys == _key(point)]
        row: dict[str, float] = {}
        for t in timers:
            col = f"fom.timer.{t}.wall_s"
            if col in sel.columns and sel[col].notna().any():
                row[t] = float(sel[col].mean())
        total = float(sel["fom.pwscf_wall_s"].mean()) if "fom.pwscf_wall_s" in sel else 0.0
        if total == total:  # not NaN
            row["other"] = max(0.0, total - sum(row.values()))
        rows.append(row)
    import pandas as pd

    return pd.DataFrame(rows, index=list(labels)).fillna(0.0)


def timer_bars(*, best: str | None, baseline: str | None) -> list[tuple[str, str]]:
    """(point key, label) of the bars of ``qe_timers.png``: the baseline, then the best,
    or one bar ``baseline = best`` when the baseline is the best (not the same bar twice)."""
    if best is not None and baseline is not None and _key(best) == _key(baseline):
        return [(best, "baseline = best")]
    return [(p, n) for p, n in ((baseline, "baseline"), (best, "best")) if p is not None]


def plot_qe_study(runs: pd.DataFrame, out_dir: Path, *, best: str | None = None,
                  baseline: str | None = None, metric: str | None = None) -> list[Path]:
    """Write ``qe_wall_vs_np.png``, ``qe_wall_vs_ndiag.png`` (when ndiag varies) and
    ``qe_timers.png`` (when ``best`` or ``baseline`` is given) into ``out_dir``; return the
    paths written. ``best`` and ``baseline`` are point JSON keys as in the ``point`` column;
    ``metric`` the FOM column to plot (default ``fom.pwscf_wall_s``, else ``fom.wall_s``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metric = _metric(runs, metric)
    label = metric.removeprefix("fom.")
    written: list[Path] = []

    fig = np_figure(scaling_table(runs, metric), label)
    path = out_dir / "qe_wall_vs_np.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

    if "ndiag" in runs.columns and runs["ndiag"].nunique() > 1:
        fig = ndiag_figure(ndiag_table(runs, metric), label)
        path = out_dir / "qe_wall_vs_ndiag.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)

    pairs = timer_bars(best=best, baseline=baseline)
    if pairs and "fom.pwscf_wall_s" in runs.columns:
        timers = timer_table(runs, [p for p, _ in pairs], [n for _, n in pairs])
        fig, ax = plt.subplots(figsize=(6.5, 4))
        bottom = [0.0] * len(timers)
        for col in timers.columns:
            ax.bar(timers.index, timers[col], bottom=bottom, label=col)
            bottom = [b + v for b, v in zip(bottom, timers[col], strict=True)]
        ax.set_ylabel("wall seconds (pw.x timers, mean)")
        ax.set_title("Where pw.x spends its time")
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
        fig.tight_layout()
        path = out_dir / "qe_timers.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _legend_beside(fig: Any, ax: Any) -> None:
    """The legend right of the axes, outside them: it never covers a line or a point."""
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside right upper", fontsize="small", frameon=False)


def np_figure(table: pd.DataFrame, label: str) -> Any:
    """Wall time vs np (log 2), a line per npool, from :func:`scaling_table`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    groups = table.groupby("npool") if "npool" in table.columns else [("all", table)]
    for npool, part in groups:
        ax.errorbar(part["np"], part["mean"], yerr=part["std"], marker="o", capsize=3,
                    label=f"npool={npool}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(table["np"].unique()), [str(v) for v in sorted(table["np"].unique())])
    ax.set_xlabel("MPI ranks (np)")
    ax.set_ylabel(f"{label} (mean ± std)")
    ax.set_title("pw.x wall time vs ranks\n(best over the other parameters)")
    _legend_beside(fig, ax)
    return fig


def ndiag_figure(table: pd.DataFrame, label: str) -> Any:
    """Wall time vs ndiag, a line per (np, npool), from :func:`ndiag_table`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    keys = [k for k in ("np", "npool") if k in table.columns]
    for key, part in table.groupby(keys):
        key = key if isinstance(key, tuple) else (key,)
        name = ", ".join(f"{k}={v}" for k, v in zip(keys, key, strict=True))
        ax.errorbar(part["ndiag"], part["mean"], yerr=part["std"], marker="o", capsize=3,
                    label=name)
    ax.set_xticks(sorted(table["ndiag"].unique()))
    ax.set_xlabel("linear-algebra group size (ndiag)")
    ax.set_ylabel(f"{label} (mean ± std)")
    ax.set_title("pw.x wall time vs ndiag")
    _legend_beside(fig, ax)
    return fig
