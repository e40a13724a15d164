"""Shared fixtures: a tiny synthetic genome written as real files, and windows cut from it."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("pyfaidx")
pytest.importorskip("pyBigWig")

from tunelab.leopard.synthetic import SyntheticConfig, write_synthetic  # noqa: E402
from tunelab.leopard.windows import extract_windows  # noqa: E402

TINY = SyntheticConfig(n_chroms=4, chrom_length=16_000, site_spacing=1_000, seed=1)


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Manifest of a 4 x 16 kb synthetic genome (train chr1-2, val chr3, test chr4)."""
    return write_synthetic(tmp_path_factory.mktemp("leopard") / "synth", TINY)


@pytest.fixture(scope="session")
def windows(synth: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train/val/test .npz of 512-bp windows cut from the synthetic genome."""
    out = tmp_path_factory.mktemp("leopard-win")
    extract_windows(synth, out, window=512, n_train=32, max_eval=16, seed=0)
    return out
