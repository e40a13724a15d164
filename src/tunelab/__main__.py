"""``python -m tunelab`` runs the command line."""

from tunelab._entry import main

main()
