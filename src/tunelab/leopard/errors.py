"""Errors of the Leopard package: one line naming the file (or option) and the problem."""

from __future__ import annotations

from tunelab.errors import WorkloadError

__all__ = ["LeopardError"]


class LeopardError(WorkloadError):
    """Bad Leopard input: a missing or malformed FASTA/bigWig/BED file, mismatching
    chromosome names, a window length not divisible by 32, a batch larger than the data,
    NaN in a signal, or a checkpoint from a different architecture."""
