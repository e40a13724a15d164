"""Fortran literals as pw.x's namelists write them: reals (``1.0d-8``) and logicals (``.true.``).

Used by the input reader (:mod:`.pwinput`) and the k-point rules (:mod:`.kpoints`,
:mod:`.symmetry`, :mod:`.kmesh`); :mod:`.kpoints` exports them too.
"""

from __future__ import annotations

__all__ = ["fortran_bool", "fortran_float"]


def fortran_float(text: str) -> float:
    """A Fortran real literal (``1.0d-8``, ``2.D0``, ``5``) as a float; ValueError if not."""
    return float(text.strip().lower().replace("d", "e"))


def fortran_bool(text: str | None) -> bool:
    """A Fortran logical literal (``.true.``, ``T``, ``.t.``) as a bool; absent is False."""
    if text is None:
        return False
    return text.strip().lower().strip(".").startswith("t")
