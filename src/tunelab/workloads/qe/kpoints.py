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

The lattice and crystal symmetry are found in :mod:`.symmetry`, the k-point grids and lists
read and reduced in :mod:`.kmesh`; this module applies pw.x's rules in order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tunelab.workloads.qe.fortran import fortran_bool, fortran_float
from tunelab.workloads.qe.kmesh import (
    irreducible_bz_count,
    k_operation,
    listed_kpoints,
    reduce_grid,
)
from tunelab.workloads.qe.symmetry import (
    EPS,
    crystal_operations,
    is_group,
    lattice_operations,
    lattice_vectors,
    magnetic_filter,
    read_atoms,
    starting_moments,
)

__all__ = [
    "HYBRIDS",
    "KPointCount",
    "compute_kpoints",
    "fortran_bool",
    "fortran_float",
    "is_hybrid_dft",
]

MAX_GRID_POINTS = 100_000
"""Largest automatic grid (nk1·nk2·nk3) reduced here; larger ones are left to pw.x."""


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
    lat = lattice_vectors(system, cards)
    if lat is None:
        return None
    at, alat = lat
    atoms = read_atoms(system, cards, labels, at, alat)
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
    moments = starting_moments(system, len(labels))
    magnetic = noncolin and bool(np.any(np.abs(moments) > 1e-6))
    time_reversal = not noinv and not magnetic
    lattice = lattice_operations(at)
    nrot = len(lattice)
    kops = [k_operation(op) for op in lattice]
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
            base = reduce_grid((flat[0], flat[1], flat[2]), shift, grid_kops, True)
            n = len(base) * nppstr
            return KPointCount(n * spins, n, spins, 1, nrot,
                               f"{len(base)} strings of {nppstr} points (lberry)")
        kpoints = reduce_grid(grid, shift, grid_kops, time_reversal)
    elif mode == "gamma":
        kpoints = [np.zeros(3)]
    elif mode in ("tpiba", "crystal", "tpiba_b", "crystal_b"):
        listed = listed_kpoints(mode, lines, at, alat)
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
    tol = EPS
    for _attempt in range(3):
        found = crystal_operations(lattice, atoms, tol, fractional)
        if magnetic:
            crystal = magnetic_filter(found, lattice, atoms, moments, at, alat, allow_trev)
        else:
            crystal = [(i, ft, img, False) for i, ft, img in found]
        if fortran_bool(system.get("gate")):
            crystal = [c for c in crystal if lattice[c[0]][2, 2] != -1]
        if nosym_evc:
            crystal = crystal[:1]
        if is_group([lattice[c[0]] for c in crystal], [c[1] for c in crystal]):
            break
        tol /= 2
    else:
        crystal = [(0, np.zeros(3), list(range(len(atoms.types))), False)]
    nsym = len(crystal)
    if calculation == "bands":
        n = len(kpoints)
        return KPointCount(n * spins, n, spins, nsym, nrot, "band path, used as listed")
    sub = [(kops[i], trev) for i, _, _, trev in crystal]
    n = irreducible_bz_count(kpoints, kops, sub, minus_k=time_reversal)
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
