"""Scale-up vs scale-out of data-parallel ResNet-50 on virtual nodes, and the fitted model.

Runs ``examples/scaling-resnet50-full.yaml`` (emulated V100 compute, 1-16 workers on 1, 2 or 4
virtual nodes, 10 Gbit/s links; the engine interleaves the layouts round by round, so slow
drift of the machine hits them alike), or analyses a study directory that already holds it,
then prints:

* the measured table: workers x layout -> images/s, speedup and efficiency with 95 % CIs;
* scale-out vs scale-up at equal workers (ratio, CI, verdict);
* the step-time model fitted without the 8-worker points, its parameters, its error on the
  held-out points, and the measured vs predicted scale-out/scale-up ratio at 8 workers (the
  issue's target: within 10 %);
* the model's validity (:func:`tunelab.scaling.validate`): fitted without the largest worker
  count (extrapolation, 2x) and without each interior one (interpolation), the errors;
* the model fitted on every point, forecasting 8 to 64 workers with 95 % prediction
  intervals — or saying why it cannot — beside the seed's figures.

Usage (root, ~25 min on 2 quiet cores)::

    python benchmarks/ddp_scaling_model.py --dir runs/scaling-resnet50-full
    python benchmarks/ddp_scaling_model.py --dir runs/scaling-resnet50-full --no-run  # analyse
    python benchmarks/ddp_scaling_model.py --recorded   # the means in docs/workloads/ddp.md
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tunelab.errors import TunelabError
from tunelab.scaling import (
    Observation,
    StepModel,
    fit_step_model,
    forecast,
    holdout,
    layout_gaps,
    observations,
    scaling_table,
    validate,
)
from tunelab.stats import StatsError
from tunelab.store import open_store

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "scaling-resnet50-full.yaml"
GB = 1e9

# The 10 Gbit/s study of docs/workloads/ddp.md as recorded there (mean images/s of 3 runs
# per point, 2 shared cores, emulated V100 compute 0.17 s, 102.2 MB of gradients per step):
# (workers, nodes, images/s).
RECORDED = ((1, 1, 237.2), (2, 1, 347.1), (2, 2, 208.8), (4, 1, 378.9), (4, 2, 303.9),
            (4, 4, 328.9), (8, 1, 517.9), (8, 2, 415.1), (8, 4, 391.1), (16, 1, 614.2),
            (16, 2, 572.0), (16, 4, 542.2))


def recorded_observations() -> list[Observation]:
    """The recorded means as the model's observations (weak scaling, 64 images per worker;
    the measured compute of an emulated step, 0.171 s)."""
    return [Observation(workers=n, nodes=k, n=3, step_s=64 * n / x, compute_s=0.171,
                        grad_bytes=102.2e6, samples_per_step=64.0 * n, throughput=x, hosts=1,
                        host_cores=2.0, gpu=False, link_limit_bw=10e9 / 8)
            for n, k, x in RECORDED]


def _validity(obs: list[Observation], cores: float | None) -> None:
    """The model's checks on held-out sizes and its forecasts beyond them."""
    check = validate(obs, shared_cores=cores)
    print("\nValidity (tunelab.scaling.validate): fitted without sizes, predicting them")
    if check.extrapolation is None:
        print(f"  extrapolation: no check: {check.why_not}")
    else:
        e = check.extrapolation
        errors = ", ".join(f"{p.nodes} node(s) {100 * p.error:+.1f}%"
                           for p in e.points if p.held_out)
        print(f"  extrapolation {e.factor:g}x (without {max(e.held)} workers): {errors}; "
              f"max {100 * e.max_error:.1f}%")
    for h in check.interpolation:
        errors = ", ".join(f"{p.nodes} node(s) {100 * p.error:+.1f}%"
                           for p in h.points if p.held_out)
        print(f"  interpolation (without {h.held[0]} workers): {errors}")
    model = fit_step_model(obs, shared_cores=cores)
    print(f"  forecasts of the model fitted on every point (95 % prediction intervals; "
          f"fit residual sd {100 * model.residual_sd:.1f}% on {model.residual_df} df):")
    most = max(o.workers for o in obs)
    for n, k in ((most // 2, 1), (most, 4), (2 * most, 2), (2 * most, 4), (4 * most, 4)):
        f = forecast(obs, n, k, model=model, validation=check, shared_cores=cores)
        if f.throughput is None:
            print(f"  {n:>3} workers on {k} node(s): {f.cannot}")
            continue
        interval = (f" [{f.low:.0f}, {f.high:.0f}]" if f.low is not None and f.high is not None
                    else "")
        print(f"  {n:>3} workers on {k} node(s): {f.throughput:.0f}{interval} images/s"
              + (f" ({f.note})" if f.note else ""))


def _run(study_file: Path, directory: Path) -> None:
    from tunelab.execute.runner import run_study
    from tunelab.execute.study import prepare_study
    from tunelab.spec import load_study

    outcome = run_study(prepare_study(load_study(study_file)), directory)
    print(f"runs: {outcome.ran} now, {outcome.previously_done} before ({outcome.counts})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("runs/scaling-resnet50-full"))
    ap.add_argument("--study", type=Path, default=EXAMPLE)
    ap.add_argument("--no-run", action="store_true", help="analyse the directory only")
    ap.add_argument("--hold-out", type=int, default=8,
                    help="worker count left out of the fit (one the runs measured)")
    ap.add_argument("--other-link", type=Path, default=None, metavar="DIR",
                    help="a study of the same workers on another link limit: compare its "
                         "scale-out/scale-up ratios with the model's, given only that limit")
    ap.add_argument("--recorded", action="store_true",
                    help="analyse the means recorded in docs/workloads/ddp.md (no runs)")
    ap.add_argument("--cores", type=float, default=None,
                    help="cores of the machine the virtual nodes share (default: from the "
                         "runs' host_cores, else this machine's)")
    args = ap.parse_args()
    try:
        return _main(args)
    except (StatsError, TunelabError) as exc:
        print(f"ddp_scaling_model: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    if args.recorded:
        obs = recorded_observations()
        _held_out(obs, args.hold_out, args.cores or 2.0)
        _validity(obs, args.cores or 2.0)
        return 0
    if not args.no_run:
        _run(args.study, args.dir)
    with open_store(args.dir) as store:
        runs = store.runs_frame()

    print("\nMeasured (mean of the runs; 95% CI of speedup and efficiency)")
    print(f"{'workers':>7} {'nodes':>5} {'w/node':>6} {'n':>2} {'images/s':>9} "
          f"{'speedup [CI]':>22} {'efficiency [CI]':>22} {'Karp-Flatt':>10}")
    for p in scaling_table(runs):
        print(f"{p.workers:>7} {p.nodes:>5} {p.workers_per_node:>6} {p.n:>2} {p.mean:>9.1f} "
              f"{p.speedup:>7.2f} [{p.speedup_low:5.2f}, {p.speedup_high:5.2f}] "
              f"{100 * p.efficiency:>6.1f}% [{100 * p.efficiency_low:5.1f}, "
              f"{100 * p.efficiency_high:5.1f}] {p.karp_flatt:>10.3f}")

    print("\nScale-out vs scale-up at equal workers (ratio > 1: more nodes faster)")
    for g in layout_gaps(runs):
        print(f"  {g.workers:>2} workers: {g.nodes} nodes vs {g.ref_nodes}: ratio {g.ratio:.3f} "
              f"[{g.ci_low:.3f}, {g.ci_high:.3f}] gap {g.gap_pct:+.1f}% -> {g.verdict.value}")

    obs = observations(runs)
    cores = args.cores
    if cores is None and not any(o.host_cores for o in obs):
        cores = float(os.cpu_count() or 1)  # runs recorded before host_cores existed
    ok = _held_out(obs, args.hold_out, cores)
    _validity(obs, cores)

    full = fit_step_model(obs, shared_cores=cores)
    print(f"\nModel fitted on every point: overhead {full.overhead_s * 1e3:.1f} ms, host "
          f"{full.host_bw / GB:.3f} GB/s, link {full.link_bw / GB:.3f} GB/s, residual "
          f"{full.residual_pct:.1f}%")
    if args.other_link is not None:
        _other_link(full, args.other_link)
    _versus_seed("this machine (fitted)", full, obs, cores)
    # The seed's cluster, from nominal figures rather than a fit: V100 fp32 step at batch 64
    # as emulated here, NVLink inside a server (~100 GB/s ring bandwidth), EDR InfiniBand
    # between servers (100 Gbit/s, ~11 GB/s achieved), one GPU per worker (no sharing).
    seed = full.with_(overhead_s=0.002, host_bw=100e9, link_bw=11e9, shared_cores=0.0,
                      link_limit_bw=12.5e9)
    _versus_seed("the seed's cluster (nominal V100/NVLink/EDR, not fitted)", seed)
    return 0 if ok else 1


def _held_out(obs: list[Observation], held: int, cores: float | None) -> bool:
    """The model fitted without the ``held``-worker points: its parameters, its errors there,
    and the scale-out/scale-up ratios there (True when those are within 10 %)."""
    check = holdout(obs, [held], shared_cores=cores)
    m = check.model
    print(f"\nModel fitted without the {held}-worker points (on {sorted(set(m.fitted_on))}):")
    print(f"  overhead {m.overhead_s * 1e3:.1f} ms, host all-reduce bandwidth "
          f"{m.host_bw / GB:.3f} GB/s (one CPU of {m.shared_cores:g} cores shared by all), "
          f"link bandwidth {m.link_bw / GB:.3f} GB/s ({8 * m.link_bw / GB:.2f} Gbit/s), "
          f"compute {m.compute_s * 1e3:.0f} ms (contention {m.contention:.3f} per worker "
          f"sharing a host), fit residual {m.residual_pct:.1f}%")
    for p in check.points:
        if p.held_out:
            print(f"  held out {p.workers:>2} workers on {p.nodes} node(s): predicted "
                  f"{p.predicted:7.1f} images/s, measured {p.measured:7.1f} "
                  f"({100 * p.error:+.1f}%)")
    print(f"  held-out error: mean {100 * check.mean_error:.1f}%, max "
          f"{100 * check.max_error:.1f}%")
    ok = True
    for n, ref, k, measured, predicted in check.ratios:
        err = 100 * (predicted / measured - 1)
        ok = ok and abs(err) <= 10
        print(f"  RATIO {n} workers, {k} nodes / {ref} node: measured {measured:.3f}, "
              f"predicted {predicted:.3f} ({err:+.1f}%) "
              f"{'within' if abs(err) <= 10 else 'OUTSIDE'} 10%")
    return ok


def _other_link(model: StepModel, directory: Path) -> None:
    """The model fitted on one link limit, told only another limit, against measurements."""
    with open_store(directory) as store:
        other = observations(store.runs_frame())
    limits = {o.link_limit_bw for o in other}
    limit = min(limits)
    moved = model.with_(link_limit_bw=limit)
    print(f"\nAnother link ({8 * limit / GB:g} Gbit/s, {directory}): the model above with only "
          "the limit changed")
    by = {(o.workers, o.nodes): o for o in other}
    for (n, k), o in sorted(by.items()):
        if k == 1 or (n, 1) not in by:
            continue
        measured = o.throughput / by[(n, 1)].throughput
        predicted = moved.throughput(n, k) / moved.throughput(n, 1)
        print(f"  {n} workers, {k} nodes / 1 node: measured {measured:.3f}, predicted "
              f"{predicted:.3f} ({100 * (predicted / measured - 1):+.1f}%)")


def _versus_seed(name: str, m: StepModel, obs: list[Observation] | None = None,
                 cores: float | None = None) -> None:
    """The seed's figures from model ``m``; with the observations it was fitted on, each
    figure only where :func:`forecast` allows the layouts it needs (else why not)."""
    check = validate(obs, shared_cores=cores) if obs is not None else None
    refused: list[str] = []

    def x(n: int, k: int) -> float | None:
        if obs is None:
            return m.throughput(n, k)
        f = forecast(obs, n, k, model=m, validation=check, shared_cores=cores)
        if f.throughput is None and f.cannot not in refused:
            refused.append(f.cannot)
        return f.throughput

    def pct(a: float | None, b: float | None, loss: bool = False) -> str:
        if a is None or b is None:
            return "n/a"
        return f"{100 * (1 - a / b) if loss else 100 * (a / b - 1):+.1f}%"

    x1, x16, x32 = x(1, 1), x(16, 2), x(32, 4)
    efficiency = "n/a" if x1 is None or x32 is None else f"{100 * x32 / x1 / 32:.0f}%"
    print(f"\n{name}: 8 -> 16 workers {pct(x16, x(8, 1))} (seed: about +70%); "
          f"16 workers on 4 nodes vs 2: {pct(x(16, 4), x16, loss=True)} (seed: 8.5%); "
          f"4 workers on 2 nodes vs 1: {pct(x(4, 2), x(4, 1), loss=True)} (seed: 4.9%); "
          f"32 workers on 4 nodes: efficiency {efficiency}")
    for why in refused:
        print(f"  n/a: {why}")


if __name__ == "__main__":
    sys.exit(main())
