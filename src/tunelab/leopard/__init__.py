"""Leopard: a 1-D U-Net that predicts transcription-factor binding at single-nucleotide
resolution from DNA sequence and chromatin accessibility (DNase-seq).

Modules (torch is imported lazily by each, never here):

* :mod:`~tunelab.leopard.model` — the U-Net (475,969 parameters for 5 input channels);
* :mod:`~tunelab.leopard.data` — the manifest, chromosome splits, whole chromosomes loaded,
  length-proportional window sampling, DNase scale augmentation, label masks;
* :mod:`~tunelab.leopard.genomefiles` — FASTA / bigWig / narrowPeak readers;
* :mod:`~tunelab.leopard.synthetic` — a synthetic genome written as real files;
* :mod:`~tunelab.leopard.windows` — pre-extracted ``.npz`` window arrays;
* :mod:`~tunelab.leopard.metrics` — PR-AUC (1001 thresholds), Dice, binary IoU, masked;
* :mod:`~tunelab.leopard.train` / :mod:`~tunelab.leopard.distributed` — (DDP) training
  (its set-up in :mod:`~tunelab.leopard.trainsetup`);
* :mod:`~tunelab.leopard.predict` — whole-chromosome prediction to bigWig / bedGraph (its
  windows and sections planned by :mod:`~tunelab.leopard.tiling`);
* :mod:`~tunelab.leopard.cli` — ``tunelab leopard synth | extract | train | predict``.
"""

from __future__ import annotations

import os

from tunelab.leopard.errors import LeopardError

# Before torch loads its OpenMP runtime (it reads this once): threads waiting at the end of a
# parallel region sleep instead of spinning. On a 2-core machine shared with other work, two
# spinning threads made prediction 10-20x slower than two sleeping ones (they burn the time
# slice the thread they wait for needs); on an idle machine sleeping costs a few per cent.
# An explicit OMP_WAIT_POLICY is respected.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["LeopardError"]
