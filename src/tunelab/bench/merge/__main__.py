"""``python -m tunelab.bench.merge``: the merge benchmark (options: ``--help``)."""

from tunelab.bench.merge.cli import main_merge

main_merge()
