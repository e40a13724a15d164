"""K-points in crystal coordinates: automatic grids, explicit lists and band paths, reduced
by symmetry as pw.x 6.7 reduces them.

Steps 2 and 4 of the rules in :mod:`.kpoints`: a Monkhorst-Pack grid reduced with the
lattice's operations (and k ↔ -k); an explicit list or band path read point by point; and the
number of points that the lattice-irreducible ones expand to under the crystal's smaller group.
The operations come from :mod:`.symmetry` and act here on k-points
(:func:`k_operation`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from tunelab.workloads.qe.fortran import fortran_float
from tunelab.workloads.qe.symmetry import EPS

__all__ = [
    "MAX_LIST_POINTS",
    "irreducible_bz_count",
    "k_operation",
    "listed_kpoints",
    "reduce_grid",
]

MAX_LIST_POINTS = 100_000
"""Largest explicit k-point list (band paths expanded) handled here."""


def k_operation(op: np.ndarray) -> np.ndarray:
    """The operation acting on k-points in crystal (reciprocal-basis) coordinates."""
    return np.rint(np.linalg.inv(op).T).astype(int)


def reduce_grid(grid: tuple[int, int, int], shift: tuple[int, int, int],
                kops: Sequence[np.ndarray], time_reversal: bool) -> list[np.ndarray]:
    """The points of a Monkhorst-Pack grid that are inequivalent under ``kops`` (and
    k ↔ -k), in pw.x's grid order."""
    n = np.array(grid, dtype=float)
    half = np.array(shift, dtype=float) / 2.0
    idx = np.array(list(itertools.product(*(range(g) for g in grid))), dtype=float)
    points = (idx + half) / n
    total = len(points)
    owner = np.arange(total)
    mats = np.array(kops, dtype=float)
    signs = (1.0, -1.0) if time_reversal else (1.0,)
    for nk in range(total):
        if owner[nk] != nk:
            continue
        rotated = points[nk] @ mats.transpose(0, 2, 1)  # (nops, 3)
        for sign in signs:
            xkr = sign * (rotated - np.rint(rotated))
            scaled = xkr * n - half
            on_grid = np.all(np.abs(scaled - np.rint(scaled)) <= EPS, axis=1)
            for row in scaled[on_grid]:
                ijk = np.mod(np.rint(row).astype(int), grid)
                j = int((ijk[0] * grid[1] + ijk[1]) * grid[2] + ijk[2])
                if j > nk and owner[j] == j:
                    owner[j] = nk
    return [points[i] - np.rint(points[i]) for i in range(total) if owner[i] == i]


def irreducible_bz_count(kpoints: Sequence[np.ndarray], parent: Sequence[np.ndarray],
                         sub: Sequence[tuple[np.ndarray, bool]], minus_k: bool) -> int:
    """How many k-points pw.x's irreducible_BZ makes of ``kpoints`` (irreducible for the
    lattice group ``parent``) for the crystal group ``sub`` (k-operation, time reversal)."""
    sub_mats = np.array([m for m, _ in sub], dtype=float)
    sub_signs = np.array([-1.0 if t else 1.0 for _, t in sub])
    parent_mats = np.array(parent, dtype=float)
    total = 0
    for k in kpoints:
        star = k @ parent_mats.transpose(0, 2, 1)
        reps: list[np.ndarray] = []
        for v in star:
            images = sub_signs[:, None] * (v @ sub_mats.transpose(0, 2, 1))
            if minus_k:
                images = np.concatenate([images, -images])
            if any(
                np.any(np.all(np.abs((images - r) - np.rint(images - r)) < EPS, axis=1))
                for r in reps
            ):
                continue
            reps.append(v)
        total += len(reps)
    return total


def _path(points: list[np.ndarray], weights: list[int]) -> list[np.ndarray] | None:
    out: list[np.ndarray] = []
    for i in range(len(points) - 1):
        w = weights[i]
        if w < 1:
            return None
        step = (points[i + 1] - points[i]) / w
        out += [points[i] + j * step for j in range(w)]
        if len(out) > MAX_LIST_POINTS:
            return None
    out.append(points[-1])
    return out


def listed_kpoints(mode: str, lines: list[str], at: np.ndarray, alat: float
                   ) -> list[np.ndarray] | None:
    """The points of an explicit K_POINTS list (``tpiba``/``crystal``, or a band path
    ``tpiba_b``/``crystal_b`` expanded point by point) in crystal coordinates; None for
    other units, a list that does not add up or more than :data:`MAX_LIST_POINTS` points."""
    nks = int(lines[0].split()[0])
    if nks < 1 or nks > MAX_LIST_POINTS or len(lines) < nks + 1:
        return None
    rows = [line.split() for line in lines[1 : 1 + nks]]
    coords = [np.array([fortran_float(x) for x in r[:3]]) for r in rows]
    base = mode.removesuffix("_b")
    if base == "tpiba":  # Cartesian, units of 2π/a: crystal components are k · a_i / a
        coords = [at @ k / alat for k in coords]
    elif base != "crystal":
        return None
    if mode.endswith("_b"):
        weights = [int(fortran_float(r[3])) if len(r) > 3 else 1 for r in rows]
        return _path(coords, weights)
    return coords
