"""Benchmark programs tunelab owns and tunes like any other workload.

Each benchmark is a program in its own right (``python -m tunelab.bench.<name>``) that prints a
human-readable table and, last, one JSON line of figures of merit for the engine.

* :mod:`tunelab.bench.merge` — all-to-all dataframe merge over MPI, UCXX, TCP or Dask.
"""
