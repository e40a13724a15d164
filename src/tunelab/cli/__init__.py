"""The ``tunelab`` command line.

Exit codes: 0 success; 1 the study has runs that failed (``run`` and every command that reads a
study: ``status``, ``compare``, ``best``, ``report``); 2 bad input (any
:class:`~tunelab.errors.TunelabError` or usage error, printed as one line); 130 interrupted.

Results go to standard output, rendered by :mod:`tunelab.report.output` (``--format
text|json|csv|markdown``; plain lines when standard output is not a terminal); status
messages and progress go to standard error.
"""

from __future__ import annotations

import contextlib
import os
import sys

import typer

from tunelab.cli import bounds, catalog, results, study
from tunelab.cli.common import Interrupted, app, ignore_further_signals
from tunelab.cli.pipes import ReaderLeft, guard_stdout, silence_stdout
from tunelab.console import usage_error_line
from tunelab.errors import TunelabError, interrupted
from tunelab.report.output import message

__all__ = ["app", "main"]

COMMANDS = (study.run, study.status, study.space, results.compare, results.best,
            results.forecast, results.report, results.script, results.combine,
            results.replay, results.export, bounds.bounds, catalog.workloads, catalog.init)
"""The commands of ``app``, in the order ``tunelab --help`` lists them."""
for _command in COMMANDS:
    app.command()(_command)


def _mount_subcommands() -> None:
    """Workload programs with CLIs of their own (their heavy imports happen on use only)."""
    from tunelab.bench.cli import app as bench_app
    from tunelab.leopard.cli import app as leopard_app

    app.add_typer(bench_app, name="bench",
                  help="Benchmark programs tunelab owns (the all-to-all merge, DDP training).")
    app.add_typer(leopard_app, name="leopard",
                  help="Leopard DNA U-Net: synthetic data, training, prediction.")


_mount_subcommands()


def main() -> None:
    """Console-script entry point: one-line errors, exit status 2 on bad input; exit status
    0, quietly, when standard output's reader leaves early (see :mod:`tunelab.cli.pipes`)."""
    guard_stdout()
    try:
        rc = app(standalone_mode=False)  # returns a typer.Exit's code instead of raising it
        if rc == 130:  # typer turned a KeyboardInterrupt into a silent exit 130
            _exit_interrupted("tunelab: interrupted")
    except Interrupted as exc:
        _exit_interrupted(str(exc))
    except TunelabError as exc:
        message(f"tunelab: error: {_one_line(str(exc))}")
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        _exit_interrupted("tunelab: interrupted")
    except typer.exceptions.TyperException as exc:  # usage errors (unknown option, …)
        line = usage_error_line(exc)
        if line is None:
            raise
        message(f"tunelab: error: {line}")
        sys.exit(int(getattr(exc, "exit_code", 2)))
    except RuntimeError as exc:
        if not interrupted(exc):
            raise
        _exit_interrupted("tunelab: interrupted")
    except (ReaderLeft, BrokenPipeError):  # `tunelab compare DIR | head`: not an error
        silence_stdout()
        sys.exit(0)
    except OSError as exc:  # a path given that the system refuses (name too long, no access)
        message(f"tunelab: error: {_os_error_line(exc)}")
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


def _exit_interrupted(text: str) -> None:
    """Say why, and exit 130 at once: an interrupt that passed through code run by
    ``PyRun_String`` makes Python end a normal exit by killing itself with SIGINT."""
    ignore_further_signals()
    with contextlib.suppress(OSError, ValueError):  # (a hang-up took the terminal away)
        message(text)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os._exit(130)


def _os_error_line(exc: OSError) -> str:
    """``path: reason`` of an error the system gave on a path (the path shortened)."""
    name = exc.filename if exc.filename is not None else ""
    shown = str(name) if len(str(name)) <= 200 else f"{str(name)[:100]}…{str(name)[-60:]}"
    reason = exc.strerror or str(exc)
    return _one_line(f"{shown}: {reason}" if shown else reason)


def _one_line(text: str) -> str:
    return " ".join(text.split())
