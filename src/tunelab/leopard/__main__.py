"""``python -m tunelab.leopard``: the Leopard command line."""

from __future__ import annotations

from tunelab.leopard.cli import main

if __name__ == "__main__":
    main()
