"""The symmetry operations of a pw.x input's lattice and crystal, found as pw.x 6.7 finds them.

Steps 1 and 3 of the rules in :mod:`.kpoints`: the lattice vectors (from ``ibrav`` with
``celldm``/``A``…, or ``CELL_PARAMETERS``); the operations of the Bravais lattice, out of the
24 proper rotations of the cube and the 8 more of the hexagonal lattice, each also times the
inversion; the atoms in crystal coordinates; the lattice operations that are symmetries of the
crystal (with a fractional translation where allowed), and of those the ones that keep the
starting magnetic moments (some only with time reversal). An operation is an integer matrix
acting on the crystal coordinates of positions (x' = P x).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tunelab.workloads.qe.fortran import fortran_float

__all__ = [
    "BOHR_ANGSTROM",
    "EPS",
    "Atoms",
    "crystal_operations",
    "is_group",
    "lattice_operations",
    "lattice_vectors",
    "magnetic_filter",
    "read_atoms",
    "starting_moments",
]

BOHR_ANGSTROM = 0.52917720859
"""Bohr radius in Angstrom, the value pw.x 6.x uses."""

EPS = 1e-5
"""pw.x's tolerance for positions, fractional translations and k-points (crystal units)."""

_EPS_LATTICE = 1e-6
_FRACTIONS = (2, 3, 4, 6)


# -- the lattice ------------------------------------------------------------------------


def _cosines(nl: Mapping[str, str]) -> dict[int, float]:
    cell = {i: float(fortran_float(nl[f"celldm({i})"])) for i in range(1, 7)
            if f"celldm({i})" in nl}
    if "a" in nl:  # A, B, C, cosAB, cosAC, cosBC (Angstrom)
        a = fortran_float(nl["a"])
        cell[1] = a / BOHR_ANGSTROM
        if "b" in nl:
            cell[2] = fortran_float(nl["b"]) / a
        if "c" in nl:
            cell[3] = fortran_float(nl["c"]) / a
        ibrav = int(nl.get("ibrav", "0"))
        cos = {k: fortran_float(nl[k]) for k in ("cosab", "cosac", "cosbc") if k in nl}
        if ibrav in (0, 14):
            cell[4], cell[5], cell[6] = (cos.get("cosbc", 0.0), cos.get("cosac", 0.0),
                                         cos.get("cosab", 0.0))
        elif ibrav in (-12, -13):
            cell[5] = cos.get("cosac", 0.0)
        else:
            cell[4] = cos.get("cosab", 0.0)
    return cell


def _bravais(ibrav: int, cell: Mapping[int, float]) -> np.ndarray | None:
    """Rows a1, a2, a3 in units of a (celldm(1)) for pw.x's ``ibrav`` conventions."""
    b, c = cell.get(2, 0.0), cell.get(3, 0.0)
    c4, c5, c6 = cell.get(4, 0.0), cell.get(5, 0.0), cell.get(6, 0.0)
    s3 = math.sqrt(3.0)
    if ibrav == 1:
        return np.eye(3)
    if ibrav == 2:
        return 0.5 * np.array([[-1, 0, 1], [0, 1, 1], [-1, 1, 0]], dtype=float)
    if ibrav == 3:
        return 0.5 * np.array([[1, 1, 1], [-1, 1, 1], [-1, -1, 1]], dtype=float)
    if ibrav == -3:
        return 0.5 * np.array([[-1, 1, 1], [1, -1, 1], [1, 1, -1]], dtype=float)
    if ibrav == 4:
        return np.array([[1, 0, 0], [-0.5, s3 / 2, 0], [0, 0, c]])
    if ibrav in (5, -5):
        tx = math.sqrt((1 - c4) / 2)
        ty = math.sqrt((1 - c4) / 6)
        tz = math.sqrt((1 + 2 * c4) / 3)
        if ibrav == 5:
            return np.array([[tx, -ty, tz], [0, 2 * ty, tz], [-tx, -ty, tz]])
        u, v = tz - 2 * math.sqrt(2) * ty, tz + math.sqrt(2) * ty
        return np.array([[u, v, v], [v, u, v], [v, v, u]]) / s3
    if ibrav == 6:
        return np.array([[1, 0, 0], [0, 1, 0], [0, 0, c]])
    if ibrav == 7:
        return 0.5 * np.array([[1, -1, c], [1, 1, c], [-1, -1, c]])
    if ibrav == 8:
        return np.array([[1, 0, 0], [0, b, 0], [0, 0, c]])
    if ibrav == 9:
        return np.array([[0.5, b / 2, 0], [-0.5, b / 2, 0], [0, 0, c]])
    if ibrav == -9:
        return np.array([[0.5, -b / 2, 0], [0.5, b / 2, 0], [0, 0, c]])
    if ibrav == 91:
        return np.array([[1, 0, 0], [0, b / 2, -c / 2], [0, b / 2, c / 2]])
    if ibrav == 10:
        return np.array([[0.5, 0, c / 2], [0.5, b / 2, 0], [0, b / 2, c / 2]])
    if ibrav == 11:
        return np.array([[0.5, b / 2, c / 2], [-0.5, b / 2, c / 2], [-0.5, -b / 2, c / 2]])
    if ibrav == 12:
        return np.array([[1, 0, 0], [b * c4, b * math.sqrt(1 - c4 * c4), 0], [0, 0, c]])
    if ibrav == -12:
        return np.array([[1, 0, 0], [0, b, 0], [c * c5, 0, c * math.sqrt(1 - c5 * c5)]])
    if ibrav == 13:
        return np.array([[0.5, 0, -c / 2], [b * c4, b * math.sqrt(1 - c4 * c4), 0],
                         [0.5, 0, c / 2]])
    if ibrav == -13:
        return np.array([[0.5, b / 2, 0], [-0.5, b / 2, 0],
                         [c * c5, 0, c * math.sqrt(1 - c5 * c5)]])
    if ibrav == 14:
        sg = math.sqrt(1 - c6 * c6)
        vol = 1 + 2 * c4 * c5 * c6 - c4 * c4 - c5 * c5 - c6 * c6
        if vol <= 0 or sg == 0:
            return None
        return np.array([[1, 0, 0], [b * c6, b * sg, 0],
                         [c * c5, c * (c4 - c5 * c6) / sg, c * math.sqrt(vol) / sg]])
    return None


def lattice_vectors(nl: Mapping[str, str], cards: Mapping[str, tuple[str, list[str]]]
                    ) -> tuple[np.ndarray, float] | None:
    """Lattice vectors (rows, bohr) and alat (bohr); None when not determinable."""
    ibrav = int(nl.get("ibrav", "0"))
    cell = _cosines(nl)
    if ibrav != 0:
        rows = _bravais(ibrav, cell)
        if rows is None or 1 not in cell:
            return None
        return rows * cell[1], cell[1]
    if "CELL_PARAMETERS" not in cards:
        return None
    unit, lines = cards["CELL_PARAMETERS"]
    rows = np.array([[fortran_float(x) for x in line.split()[:3]] for line in lines[:3]])
    if rows.shape != (3, 3):
        return None
    unit = unit or ("alat" if 1 in cell else "bohr")
    if unit == "angstrom":
        rows = rows / BOHR_ANGSTROM
    elif unit == "alat":
        if 1 not in cell:
            return None
        rows = rows * cell[1]
    elif unit != "bohr":
        return None
    alat = cell.get(1, float(np.linalg.norm(rows[0])))
    return rows, alat


def _candidate_rotations() -> list[np.ndarray]:
    """The 24 proper rotations of the cube and the 8 of the hexagonal lattice beyond them
    (±60° and ±120° about z; 180° about in-plane axes at 30°, 60°, 120° and 150°)."""
    rots = []
    for perm in itertools.permutations(range(3)):
        for signs in itertools.product((1, -1), repeat=3):
            m = np.zeros((3, 3))
            for i, j in enumerate(perm):
                m[i, j] = signs[i]
            if np.linalg.det(m) > 0:
                rots.append(m)
    for deg in (60, -60, 120, -120):
        t = math.radians(deg)
        rots.append(np.array([[math.cos(t), -math.sin(t), 0], [math.sin(t), math.cos(t), 0],
                              [0, 0, 1]]))
    for deg in (30, 60, 120, 150):
        t = math.radians(2 * deg)
        rots.append(np.array([[math.cos(t), math.sin(t), 0], [math.sin(t), -math.cos(t), 0],
                              [0, 0, -1]]))
    return rots


def lattice_operations(at: np.ndarray) -> list[np.ndarray]:
    """Lattice symmetry operations as integer matrices acting on crystal coordinates of
    positions (x' = P x); the identity first."""
    a = at.T  # columns a1, a2, a3
    inv_a = np.linalg.inv(a)
    proper: list[np.ndarray] = []
    for rot in _candidate_rotations():
        p = inv_a @ rot @ a
        if np.all(np.abs(p - np.rint(p)) <= _EPS_LATTICE):
            proper.append(np.rint(p).astype(int))
    if len(proper) not in (1, 2, 4, 6, 8, 12, 24):
        proper = [np.eye(3, dtype=int)]
    ops = proper + [-p for p in proper]
    if not is_group(ops, [np.zeros(3)] * len(ops)):
        return [np.eye(3, dtype=int)]
    return ops


def is_group(ops: Sequence[np.ndarray], fts: Sequence[np.ndarray]) -> bool:
    """True when the operations (x -> P x - f) are closed under composition, each product
    found exactly once (fractional translations compared modulo the lattice)."""
    by_matrix: dict[bytes, list[np.ndarray]] = {}
    for op, ft in zip(ops, fts, strict=True):
        by_matrix.setdefault(np.asarray(op, dtype=np.int64).tobytes(), []).append(ft)
    for (si, fi), (sj, fj) in itertools.product(zip(ops, fts, strict=True), repeat=2):
        # applying (si, fi) then (sj, fj) gives (sj si, sj fi + fj)
        prod = np.asarray(sj @ si, dtype=np.int64).tobytes()
        ft = sj @ fi + fj
        matches = sum(_same_mod_lattice(fk, ft, EPS) for fk in by_matrix.get(prod, []))
        if matches != 1:
            return False
    return True


# -- the crystal -----------------------------------------------------------------------


@dataclass(frozen=True)
class Atoms:
    """The atoms of an input: species index (in ATOMIC_SPECIES order) and position of each."""

    types: tuple[int, ...]
    xau: np.ndarray  # (nat, 3) crystal coordinates


def read_atoms(nl: Mapping[str, str], cards: Mapping[str, tuple[str, list[str]]],
               labels: Sequence[str], at: np.ndarray, alat: float) -> Atoms | None:
    """The ATOMIC_POSITIONS card in crystal coordinates; None for a unit not handled
    (``crystal_sg`` among them), a species not in ``labels`` or fewer lines than ``nat``."""
    if "ATOMIC_POSITIONS" not in cards:
        return None
    unit, lines = cards["ATOMIC_POSITIONS"]
    unit = unit or "alat"
    nat = int(nl.get("nat", "0"))
    if nat < 1 or len(lines) < nat or unit not in ("alat", "bohr", "angstrom", "crystal"):
        return None
    index = {label: i for i, label in enumerate(labels)}
    types, pos = [], []
    for line in lines[:nat]:
        parts = line.split()
        if len(parts) < 4 or parts[0] not in index:
            return None
        types.append(index[parts[0]])
        pos.append([fortran_float(x) for x in parts[1:4]])
    xyz = np.array(pos)
    if unit == "crystal":
        xau = xyz
    else:
        scale = {"alat": alat, "bohr": 1.0, "angstrom": 1.0 / BOHR_ANGSTROM}[unit]
        xau = (np.linalg.inv(at.T) @ (xyz * scale).T).T
    return Atoms(tuple(types), xau)


def _same_mod_lattice(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    d = a - b
    return bool(np.all(np.abs(d - np.rint(d)) < tol))


def _image_atoms(op: np.ndarray, ft: np.ndarray, atoms: Atoms, tol: float
                 ) -> list[int] | None:
    """For each atom, the atom of the same species it lands on under (op, ft); None if
    some atom lands on none."""
    rotated = atoms.xau @ op.T
    images = []
    for na, r in enumerate(rotated):
        for nb, x in enumerate(atoms.xau):
            if atoms.types[nb] == atoms.types[na] and _same_mod_lattice(r - ft, x, tol):
                images.append(nb)
                break
        else:
            return None
    return images


def _allowed_fraction(ft: np.ndarray) -> bool:
    for f in ft:
        if abs(f) <= EPS:
            continue
        inv = 1.0 / f
        if abs(inv - round(inv)) >= EPS or round(abs(inv)) not in _FRACTIONS:
            return False
    return True


def crystal_operations(lattice: Sequence[np.ndarray], atoms: Atoms, tol: float,
                       fractional: bool) -> list[tuple[int, np.ndarray, list[int]]]:
    """(index into ``lattice``, fractional translation, image atoms) of each lattice
    operation that is a symmetry of the atoms."""
    xau = atoms.xau
    first = atoms.types[0]
    same = [na for na in range(len(xau)) if atoms.types[na] == first]
    if fractional:  # a supercell (identity + translation) disables fractional translations
        ident = lattice[0]
        for na in same[1:]:
            ft = xau[na] - xau[0] - np.rint(xau[na] - xau[0])
            if _image_atoms(ident, ft, atoms, tol) is not None:
                fractional = False
                break
    found = []
    for i, op in enumerate(lattice):
        zero = np.zeros(3)
        images = _image_atoms(op, zero, atoms, tol)
        if images is not None:
            found.append((i, zero, images))
            continue
        if not fractional:
            continue
        rotated = xau @ op.T
        for na in same:
            ft = rotated[na] - xau[0] - np.rint(rotated[na] - xau[0])
            if not _allowed_fraction(ft):
                continue
            images = _image_atoms(op, ft, atoms, tol)
            if images is not None:
                found.append((i, ft, images))
                break
    return found


def starting_moments(nl: Mapping[str, str], ntyp: int) -> np.ndarray:
    """Starting magnetic moment (Cartesian direction × magnitude) of each species."""
    moments = np.zeros((ntyp, 3))
    for t in range(ntyp):
        m = fortran_float(nl.get(f"starting_magnetization({t + 1})", "0"))
        theta = math.radians(fortran_float(nl.get(f"angle1({t + 1})", "0")))
        phi = math.radians(fortran_float(nl.get(f"angle2({t + 1})", "0")))
        moments[t] = m * np.array([math.sin(theta) * math.cos(phi),
                                   math.sin(theta) * math.sin(phi), math.cos(theta)])
    return moments


def magnetic_filter(ops: Sequence[tuple[int, np.ndarray, list[int]]],
                    lattice: Sequence[np.ndarray], atoms: Atoms, moments: np.ndarray,
                    at: np.ndarray, alat: float, allow_time_reversal: bool
                    ) -> list[tuple[int, np.ndarray, list[int], bool]]:
    """Keep the operations that leave the moments unchanged, or (with time reversal)
    reversed; the flag says which need time reversal."""
    to_crystal = np.linalg.inv(at.T / alat)
    m_cryst = np.array([to_crystal @ moments[t] for t in atoms.types])
    kept = []
    for i, ft, images in ops:
        op = lattice[i]
        sign = 1 if np.linalg.det(op) > 0 else -1  # a moment is an axial vector
        rotated = sign * (m_cryst @ op.T)
        target = m_cryst[images]
        same_ok = bool(np.all(np.abs(rotated - target).sum(axis=1) < EPS))
        flip_ok = bool(np.all(np.abs(rotated + target).sum(axis=1) < EPS))
        if same_ok:
            kept.append((i, ft, images, False))
        elif flip_ok and allow_time_reversal:
            kept.append((i, ft, images, True))
    return kept
