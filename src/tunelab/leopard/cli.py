"""``tunelab leopard …``: synth, extract, train, predict.

Mount in the main CLI with ``app.add_typer(leopard_app, name="leopard")``; run alone with
``python -m tunelab.leopard …``. Errors print as one line ``error: …`` and exit with 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from tunelab.errors import TunelabError

__all__ = ["app", "main"]

app = typer.Typer(
    help="Leopard: a DNA-decoding U-Net (TF binding from sequence + DNase).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain help: the same on a terminal, in a pipe, at any width
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.command()
def synth(
    out: Annotated[Path, typer.Argument(help="directory to write the data set into")],
    n_chroms: Annotated[int, typer.Option(help="number of chromosomes")] = 6,
    chrom_length: Annotated[int, typer.Option(help="bp per chromosome")] = 200_000,
    site_spacing: Annotated[int, typer.Option(help="bp between motif sites")] = 2_500,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
) -> None:
    """Write a synthetic genome (FASTA, DNase bigWigs, narrowPeak labels, manifest)."""
    from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic

    cfg = SyntheticConfig(n_chroms=n_chroms, chrom_length=chrom_length,
                          site_spacing=site_spacing, seed=seed)
    path = write_synthetic(out, cfg)
    typer.echo(str(path))


@app.command()
def extract(
    data: Annotated[Path, typer.Argument(help="leopard.json or its directory")],
    out: Annotated[Path, typer.Argument(help="directory for train/val/test .npz")],
    window: Annotated[int, typer.Option(help="window length (multiple of 32)")] = 10240,
    n_train: Annotated[int, typer.Option(help="training windows to draw")] = 1000,
    max_eval: Annotated[int, typer.Option(help="at most this many val/test windows")] = 256,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
) -> None:
    """Cut fixed windows from a data set into .npz files (fast loading)."""
    from tunelab.leopard.windows import extract_windows

    counts = extract_windows(data, out, window, n_train, max_eval, seed)
    typer.echo(json.dumps(counts))


@app.command()
def train(
    data: Annotated[Path, typer.Option(help="leopard.json (or dir), or a dir of .npz windows")],
    out: Annotated[Path, typer.Option(help="output directory (metrics, checkpoints)")],
    window: Annotated[int | None, typer.Option(help="window bp (default 10240 or from .npz)")]
    = None,
    in_channels: Annotated[int, typer.Option(help="5 (ACGT+DNase) or 6 (+DNase-avg)")] = 5,
    base_filters: Annotated[int, typer.Option(help="stem filters")] = 15,
    depth: Annotated[int, typer.Option(help="encoder/decoder levels")] = 5,
    kernel_size: Annotated[int, typer.Option(help="convolution kernel")] = 7,
    batch_size: Annotated[int, typer.Option(help="windows per worker per step")] = 64,
    lr: Annotated[float, typer.Option(help="base learning rate (Adam)")] = 1e-3,
    lr_scaling: Annotated[str, typer.Option(help="none | linear | sqrt in workers")] = "none",
    warmup_epochs: Annotated[float, typer.Option(help="epochs to ramp to the scaled lr")] = 0.0,
    epochs: Annotated[int, typer.Option(help="maximum epochs")] = 10,
    steps_per_epoch: Annotated[int | None, typer.Option(help="steps per epoch")] = None,
    patience: Annotated[int, typer.Option(help="early-stopping patience (val_loss)")] = 5,
    augment_scale: Annotated[float, typer.Option(help="DNase scale jitter +-")] = 0.1,
    max_eval_windows: Annotated[int, typer.Option(help="val/test windows cap (0: all)")] = 256,
    bn_momentum: Annotated[float, typer.Option(help="BatchNorm momentum (PyTorch sense; "
                                                 "Keras 0.99 = 0.01)")] = 0.01,
    seed: Annotated[int, typer.Option(help="random seed")] = 0,
    sync_bn: Annotated[bool, typer.Option(help="synchronise BatchNorm across workers")] = False,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    amp: Annotated[bool | None, typer.Option(help="mixed precision (default: on CUDA; on a "
                                             "CPU --amp is bf16 autocast)")] = None,
    compile: Annotated[bool | None, typer.Option(
        help="torch.compile the model (eager where it fails); default: when the job's "
             "measured eager time repays compiling")] = None,
    layout: Annotated[str, typer.Option(help="auto | 1d | 2d | 2d8: convolutions as 1-D, "
                                          "channels-last 2-D, or 2-D on channels padded to "
                                          "multiples of 8 (auto: the fastest, measured; "
                                          "2d8 only on a GPU)")]
    = "auto",
    graphs: Annotated[str, typer.Option(help="auto | on | off: capture the training step "
                                          "in a CUDA graph (auto: when measured faster)")]
    = "auto",
    val_windows: Annotated[int | None, typer.Option(
        help="validation windows drawn at random each epoch (seeded, the same set every "
             "epoch; default: a tiling capped by --max-eval-windows)")] = None,
    time_limit: Annotated[float | None, typer.Option(
        help="seconds: stop training after the step that passes them, then evaluate and "
             "write results as usual")] = None,
    threads: Annotated[int | None, typer.Option(help="CPU threads per process")] = None,
    resume: Annotated[bool, typer.Option(help="resume from OUT/last.pt")] = False,
    progress: Annotated[bool | None, typer.Option(help="progress bars (default: tty)")] = None,
) -> None:
    """Train the U-Net; the last stdout line is a JSON object of figures of merit."""
    from tunelab.leopard.train import TrainConfig, print_foms
    from tunelab.leopard.train import train as run_train

    cfg = TrainConfig(data=data, out=out, window=window, in_channels=in_channels,
                      base_filters=base_filters, depth=depth, kernel_size=kernel_size,
                      batch_size=batch_size, lr=lr, lr_scaling=lr_scaling,
                      warmup_epochs=warmup_epochs, epochs=epochs,
                      steps_per_epoch=steps_per_epoch, patience=patience,
                      augment_scale=augment_scale, bn_momentum=bn_momentum,
                      max_eval_windows=max_eval_windows or None, seed=seed, sync_bn=sync_bn,
                      device=device, amp=amp, compile=compile, layout=layout, graphs=graphs,
                      val_windows=val_windows, time_limit=time_limit, threads=threads,
                      resume=resume,
                      progress=progress)
    foms = run_train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print_foms(foms)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _leave_now()


def _leave_now() -> None:
    """End a data-parallel worker at once, its results written and its process group left:
    gloo's threads can still hold work with tensors when the interpreter tears down, and
    freeing them then aborts the worker ("terminate called without an active exception",
    SIGABRT: 1 run in 3 of the two-worker test beside two busy processes; pytorch/pytorch
    PR #179291 describes it). Nothing is left to finalise: files are closed, streams
    flushed here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@app.command()
def predict(
    checkpoint: Annotated[Path, typer.Option(help="best.pt or last.pt of a training run")],
    data: Annotated[Path, typer.Option(help="leopard.json (or its directory)")],
    out: Annotated[Path, typer.Option(help="output track: .bw/.bigwig or .bedGraph")],
    chroms: Annotated[str | None, typer.Option(help="comma-separated (default: test)")] = None,
    batch_size: Annotated[int | None, typer.Option(help="windows per forward pass "
                                                   "(default: 32 on a CPU, 256 on a GPU)")]
    = None,
    edge: Annotated[int | None, typer.Option(help="bp dropped at window edges "
                                             "(default window/8)")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    window: Annotated[int | None, typer.Option(help="prediction window bp (default: the "
                                               "training window)")] = None,
    stride: Annotated[int | None, typer.Option(help="bp between window starts (default "
                                               "window - 2*edge: each base once)")] = None,
    precision: Annotated[str, typer.Option(help="auto | fp32 | bf16 | fp16 (auto: bf16 "
                                           "only where the CPU runs it faster)")] = "auto",
    compile: Annotated[str, typer.Option(help="auto | on | off: torch.compile (auto: when "
                                         "the job repays it)")] = "auto",
    threads: Annotated[int | None, typer.Option(help="CPU threads (default: the cores "
                                                "this process may use)")] = None,
    zoom_levels: Annotated[int, typer.Option(help="bigWig summary levels (0-10; they cost "
                                             "time when the file is closed)")] = 0,
    readers: Annotated[int | None, typer.Option(help="reader processes (default: half the "
                                                "cores the engine leaves free)")] = None,
    writers: Annotated[int | None, typer.Option(help="bigWig writer threads (default: the "
                                                "other half)")] = None,
) -> None:
    """Predict whole chromosomes into a bigWig/bedGraph track; prints bp/s as JSON."""
    import psutil

    from tunelab.leopard.predict import predict_genome

    names = [c for c in chroms.split(",") if c] if chroms else None
    res = predict_genome(checkpoint, data, out, names, batch_size, edge, device,
                         window=window, stride=stride, precision=precision,
                         compile=compile, threads=threads, zoom_levels=zoom_levels,
                         readers=readers, writers=writers)
    sys.stderr.write(f"runtime: {res['runtime']}\n")
    if "bound_fraction" in res:
        sys.stderr.write(f"prediction: {res['windows_per_s']:.1f} windows/s "
                         f"({res['bound_fraction']:.2f} of bound: the {res['precision']} "
                         f"GEMM rate of this run, {res['gemm_flops_per_s'] / 1e9:,.1f} "
                         f"GFLOP/s, / {res['flops_per_window'] / 1e9:.3f} GFLOP a window)\n")
    # the whole process so far: Python's start and imports (torch: seconds) and the bound
    # measured after the run, which bp_per_s_end_to_end (predict_genome's own span) leaves out
    res["process_s"] = max(time.time() - psutil.Process().create_time(), res["wall_s"])
    res["bp_per_s_process"] = res["bp"] / max(res["process_s"], 1e-9)
    sys.stderr.write(f"time: {res['bp']:,.0f} bp in {res['wall_s']:.2f} s end to end (loading "
                     f"the checkpoint to the track closed: {res['bp_per_s_end_to_end']:,.0f} "
                     f"bp/s), {res['process_s']:.2f} s since the process started (with "
                     f"Python's start, the imports and the bound after the run: "
                     f"{res['bp_per_s_process']:,.0f} bp/s)\n")
    typer.echo(json.dumps(res))


def main(argv: list[str] | None = None) -> None:
    """Run the app; a :class:`TunelabError` becomes one line on stderr and exit status 2."""
    try:
        app(args=argv, prog_name="tunelab leopard")
    except TunelabError as exc:
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(2)
