"""``python -m tunelab.bench.ddp``: the DDP training benchmark (options: ``--help``)."""

from tunelab.bench.ddp.cli import main_ddp

main_ddp()
