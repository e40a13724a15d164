"""How many k-points pw.x distributes over its pools, computed from the input alone.

pw.x (6.x) decides the k-points of a run in a fixed order, and this module follows the same
rules so that ``tunelab space`` and ``--dry-run`` know the count without running pw.x:

1. the symmetry operations of the Bravais lattice: the rotations, out of the 24 proper
   rotations of the cube and the 8 extra ones of the hexagonal lattice, that map the lattice
   onto itself, plus each of them times the inversion;
2. an automatic grid (``K_POINTS automatic``) is reduced with those operations (and with
   k ↔ -k), giving the irreducible points of the *lattice*; an explicit list is taken as it
   is (band paths ``tpiba_b``/``crystal_b`` expanded point by point);
3. the symmetry of the *crystal*: the lattice operations that map every atom onto an atom
   of the same species, possibly with a fractional translation of 1/2, 1/3, 1/4 or 1/6 (not
   in a supercell, not with ``force_symmorphic``); with noncollinear magnetism
   (``noncolin`` and a starting magnetisation) only those that also keep the magnetic
   moments, some combined with time reversal;
4. each lattice-irreducible point is expanded to the points that are inequivalent under
   the crystal's operations (k ↔ -k counts as equivalent unless magnetism or ``noinv``
   break time reversal); ``calculation = 'bands'`` skips this step and ``nosym`` the
   symmetry altogether;
5. spin-polarised collinear runs (``nspin = 2``, LSDA) double the count: pw.x distributes
   spin-up and spin-down k-points over the pools separately (it prints the per-spin count).

Berry-phase strings (``lberry``: a reduced 2-D grid times ``nppstr``) and finite electric
fields (``lelfield``: the full grid) follow pw.x's own special cases. What the module does not
model (``crystal_sg`` positions, ``space_group``, ``tpiba_c`` contours) returns None, and the
caller falls back to pw.x itself or to an upper bound. The rules are those of pw.x 6.7; a
later pw.x may differ in corner cases (7.x treats noncollinear runs without spin-orbit as
magnetic even without a starting magnetisation), which is why a real run asks pw.x.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "HYBRIDS",
    "KPointCount",
    "compute_kpoints",
    "fortran_bool",
    "fortran_float",
    "is_hybrid_dft",
]

BOHR_ANGSTROM = 0.52917720859
"""Bohr radius in Angstrom, the value pw.x 6.x uses."""

MAX_GRID_POINTS = 100_000
"""Largest automatic grid (nk1·nk2·nk3) reduced here; larger ones are left to pw.x."""

MAX_LIST_POINTS = 100_000
"""Largest explicit k-point list (band paths expanded) handled here."""

_EPS_LATTICE = 1e-6
_EPS = 1e-5
_FRACTIONS = (2, 3, 4, 6)


@dataclass(frozen=True)
class KPointCount:
    """The k-points of an input as pw.x distributes them.

    ``count`` is what pw.x divides among pools (``per_spin`` × ``spins``); ``nsym`` and
    ``nrot`` are the crystal's and the lattice's symmetry operations (pw.x prints
    "``nsym`` Sym. Ops."); ``how`` says in a few words how the count arose.
    """

    count: int
    per_spin: int
    spins: int
    nsym: int
    nrot: int
    how: str


def fortran_float(text: str) -> float:
    """A Fortran real literal (``1.0d-8``, ``2.D0``, ``5``) as a float; ValueError if not."""
    return float(text.strip().lower().replace("d", "e"))


def fortran_bool(text: str | None) -> bool:
    """A Fortran logical literal (``.true.``, ``T``, ``.t.``) as a bool; absent is False."""
    if text is None:
        return False
    return text.strip().lower().strip(".").startswith("t")


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


def _lattice(nl: Mapping[str, str], cards: Mapping[str, tuple[str, list[str]]]
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


def _lattice_operations(at: np.ndarray) -> list[np.ndarray]:
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
    if not _is_group(ops, [np.zeros(3)] * len(ops)):
        return [np.eye(3, dtype=int)]
    return ops


def _is_group(ops: Sequence[np.ndarray], fts: Sequence[np.ndarray]) -> bool:
    """True when the operations (x -> P x - f) are closed under composition, each product
    found exactly once (fractional translations compared modulo the lattice)."""
    by_matrix: dict[bytes, list[np.ndarray]] = {}
    for op, ft in zip(ops, fts, strict=True):
        by_matrix.setdefault(np.asarray(op, dtype=np.int64).tobytes(), []).append(ft)
    for (si, fi), (sj, fj) in itertools.product(zip(ops, fts, strict=True), repeat=2):
        # applying (si, fi) then (sj, fj) gives (sj si, sj fi + fj)
        prod = np.asarray(sj @ si, dtype=np.int64).tobytes()
        ft = sj @ fi + fj
        matches = sum(_same_mod_lattice(fk, ft, _EPS) for fk in by_matrix.get(prod, []))
        if matches != 1:
            return False
    return True


# -- the crystal -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Atoms:
    types: tuple[int, ...]
    xau: np.ndarray  # (nat, 3) crystal coordinates


def _atoms(nl: Mapping[str, str], cards: Mapping[str, tuple[str, list[str]]],
           labels: Sequence[str], at: np.ndarray, alat: float) -> _Atoms | None:
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
    return _Atoms(tuple(types), xau)


def _same_mod_lattice(a: np.ndarray, b: np.ndarray, tol: float) -> bool:
    d = a - b
    return bool(np.all(np.abs(d - np.rint(d)) < tol))


def _image_atoms(op: np.ndarray, ft: np.ndarray, atoms: _Atoms, tol: float
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
        if abs(f) <= _EPS:
            continue
        inv = 1.0 / f
        if abs(inv - round(inv)) >= _EPS or round(abs(inv)) not in _FRACTIONS:
            return False
    return True


def _crystal_operations(lattice: Sequence[np.ndarray], atoms: _Atoms, tol: float,
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


def _moments(nl: Mapping[str, str], ntyp: int) -> np.ndarray:
    """Starting magnetic moment (Cartesian direction × magnitude) of each species."""
    moments = np.zeros((ntyp, 3))
    for t in range(ntyp):
        m = fortran_float(nl.get(f"starting_magnetization({t + 1})", "0"))
        theta = math.radians(fortran_float(nl.get(f"angle1({t + 1})", "0")))
        phi = math.radians(fortran_float(nl.get(f"angle2({t + 1})", "0")))
        moments[t] = m * np.array([math.sin(theta) * math.cos(phi),
                                   math.sin(theta) * math.sin(phi), math.cos(theta)])
    return moments


def _magnetic_filter(ops: Sequence[tuple[int, np.ndarray, list[int]]],
                     lattice: Sequence[np.ndarray], atoms: _Atoms, moments: np.ndarray,
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
        same_ok = bool(np.all(np.abs(rotated - target).sum(axis=1) < _EPS))
        flip_ok = bool(np.all(np.abs(rotated + target).sum(axis=1) < _EPS))
        if same_ok:
            kept.append((i, ft, images, False))
        elif flip_ok and allow_time_reversal:
            kept.append((i, ft, images, True))
    return kept


# -- the k-points ----------------------------------------------------------------------


def _k_operation(op: np.ndarray) -> np.ndarray:
    """The operation acting on k-points in crystal (reciprocal-basis) coordinates."""
    return np.rint(np.linalg.inv(op).T).astype(int)


def _reduce_grid(grid: tuple[int, int, int], shift: tuple[int, int, int],
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
            on_grid = np.all(np.abs(scaled - np.rint(scaled)) <= _EPS, axis=1)
            for row in scaled[on_grid]:
                ijk = np.mod(np.rint(row).astype(int), grid)
                j = int((ijk[0] * grid[1] + ijk[1]) * grid[2] + ijk[2])
                if j > nk and owner[j] == j:
                    owner[j] = nk
    return [points[i] - np.rint(points[i]) for i in range(total) if owner[i] == i]


def _expand(kpoints: Sequence[np.ndarray], parent: Sequence[np.ndarray],
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
                np.any(np.all(np.abs((images - r) - np.rint(images - r)) < _EPS, axis=1))
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


def _listed(mode: str, lines: list[str], at: np.ndarray, alat: float
            ) -> list[np.ndarray] | None:
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


def compute_kpoints(namelists: Mapping[str, Mapping[str, str]],
                    cards: Mapping[str, tuple[str, list[str]]],
                    labels: Sequence[str]) -> KPointCount | None:
    """The k-points pw.x 6.7 distributes for this input, or None where the input uses
    something these rules do not model. ``labels`` are the ATOMIC_SPECIES labels in order.
    """
    try:
        return _compute(namelists, cards, labels)
    except (ValueError, IndexError, KeyError, ZeroDivisionError, np.linalg.LinAlgError):
        return None


def _compute(namelists: Mapping[str, Mapping[str, str]],
             cards: Mapping[str, tuple[str, list[str]]],
             labels: Sequence[str]) -> KPointCount | None:
    control, system = namelists.get("control", {}), namelists.get("system", {})
    if "space_group" in system:
        return None
    lat = _lattice(system, cards)
    if lat is None:
        return None
    at, alat = lat
    atoms = _atoms(system, cards, labels, at, alat)
    if atoms is None:
        return None
    nspin = int(system.get("nspin", "1"))
    noncolin = fortran_bool(system.get("noncolin"))
    lsda = nspin == 2 and not noncolin
    spins = 2 if lsda else 1
    nosym = fortran_bool(system.get("nosym"))
    nosym_evc = fortran_bool(system.get("nosym_evc"))
    noinv = fortran_bool(system.get("noinv"))
    calculation = control.get("calculation", "scf").lower()
    lberry = fortran_bool(control.get("lberry"))
    lelfield = fortran_bool(control.get("lelfield"))
    moments = _moments(system, len(labels))
    magnetic = noncolin and bool(np.any(np.abs(moments) > 1e-6))
    time_reversal = not noinv and not magnetic
    lattice = _lattice_operations(at)
    nrot = len(lattice)
    kops = [_k_operation(op) for op in lattice]
    grid_kops = kops[:1] if nosym else kops

    mode, lines = cards.get("K_POINTS", ("gamma", []))
    mode = mode or "tpiba"
    if mode == "automatic":
        nums = [int(x) for x in lines[0].split()[:6]]
        grid = (nums[0], nums[1], nums[2])
        shift = (nums[3], nums[4], nums[5])
        if min(grid) < 1 or math.prod(grid) > MAX_GRID_POINTS:
            return None
        if lelfield:
            n = math.prod(grid)
            return KPointCount(n * spins, n, spins, 1, nrot, "full grid (lelfield)")
        if lberry:
            gdir = int(control.get("gdir", "0"))
            nppstr = int(control.get("nppstr", "0"))
            if gdir not in (1, 2, 3) or nppstr < 2:
                return None
            flat = list(grid)
            flat[gdir - 1] = 1
            base = _reduce_grid((flat[0], flat[1], flat[2]), shift, grid_kops, True)
            n = len(base) * nppstr
            return KPointCount(n * spins, n, spins, 1, nrot,
                               f"{len(base)} strings of {nppstr} points (lberry)")
        kpoints = _reduce_grid(grid, shift, grid_kops, time_reversal)
    elif mode == "gamma":
        kpoints = [np.zeros(3)]
    elif mode in ("tpiba", "crystal", "tpiba_b", "crystal_b"):
        listed = _listed(mode, lines, at, alat)
        if listed is None:
            return None
        kpoints = listed
    else:
        return None

    if nosym or lelfield:
        return KPointCount(len(kpoints) * spins, len(kpoints), spins, 1, nrot,
                           "no symmetry (nosym)" if nosym else "no symmetry (lelfield)")
    fractional = not fortran_bool(system.get("force_symmorphic"))
    allow_trev = not (noncolin and is_hybrid_dft(system))
    crystal: list[tuple[int, np.ndarray, list[int], bool]] = []
    tol = _EPS
    for _attempt in range(3):
        found = _crystal_operations(lattice, atoms, tol, fractional)
        if magnetic:
            crystal = _magnetic_filter(found, lattice, atoms, moments, at, alat, allow_trev)
        else:
            crystal = [(i, ft, img, False) for i, ft, img in found]
        if fortran_bool(system.get("gate")):
            crystal = [c for c in crystal if lattice[c[0]][2, 2] != -1]
        if nosym_evc:
            crystal = crystal[:1]
        if _is_group([lattice[c[0]] for c in crystal], [c[1] for c in crystal]):
            break
        tol /= 2
    else:
        crystal = [(0, np.zeros(3), list(range(len(atoms.types))), False)]
    nsym = len(crystal)
    if calculation == "bands":
        n = len(kpoints)
        return KPointCount(n * spins, n, spins, nsym, nrot, "band path, used as listed")
    sub = [(kops[i], trev) for i, _, _, trev in crystal]
    n = _expand(kpoints, kops, sub, minus_k=time_reversal)
    how = f"{nsym} of the lattice's {nrot} symmetries"
    if magnetic:
        how += " (magnetic, no time reversal)"
    return KPointCount(n * spins, n, spins, nsym, nrot, how)


HYBRIDS = frozenset({
    "pbe0", "b3lyp", "b3lyp-v1r", "x3lyp", "hse", "gaupbe", "hf", "scan0", "bhahlyp",
    "b86bpbex", "pbesol0", "vdw-df-cx0", "vdw-df2-0",
})
"""``input_dft`` values that are hybrid functionals (exact exchange) in pw.x."""


def is_hybrid_dft(system: Mapping[str, str]) -> bool:
    """True for a hybrid functional (``input_dft`` such as PBE0, B3LYP, HSE, or a positive
    ``exx_fraction`` in &SYSTEM): pw.x then runs its exact-exchange loops."""
    dft = system.get("input_dft", "").strip().lower()
    if dft in HYBRIDS:
        return True
    try:
        return fortran_float(system.get("exx_fraction", "0")) > 0
    except ValueError:
        return False
