"""``python -m tunelab.bench.ddp``: the DDP training benchmark (options: ``--help``)."""

from tunelab.bench.cli import main_ddp

main_ddp()
