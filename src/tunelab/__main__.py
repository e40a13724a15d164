"""``python -m tunelab`` runs the command line."""

from tunelab.cli import main

main()
