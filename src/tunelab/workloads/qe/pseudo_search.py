"""Where each pseudopotential of a pw.x input is found: one order, used by every command.

The places are searched in this order, the first holding the file wins:

1. the input's own ``pseudo_dir`` (a relative one is taken from the input file's directory);
2. the study's ``pseudo_dir`` option (relative to the study file's directory);
3. ``$ESPRESSO_PSEUDO``;
4. ``~/espresso/pseudo`` (pw.x's own default);
5. ``/usr/share/espresso/pseudo`` (Debian's ``quantum-espresso-data``).

The last three are pw.x's defaults for an input that names no ``pseudo_dir``; as in pw.x,
they are not searched for an input that names one, and a ``pseudo_dir`` that is not a
directory is refused: a file of the same name elsewhere (Debian's, typically) would
otherwise be taken in place of the one the input's author meant.

A pseudopotential this project generates itself (:data:`.pseudo.GENERATED`, the Ce PAW) that is
in none of them comes from :func:`.pseudo.pseudo_cache_dir`, generated there by a real run
(never by ``space`` or ``--dry-run``). A file found nowhere is one error naming every place
looked at, so ``space``, ``run`` and ``run --dry-run`` all say the same thing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tunelab.errors import WorkloadError
from tunelab.limits import LIMITS
from tunelab.safeyaml import shorten
from tunelab.workloads.qe.pwinput import PwInput

__all__ = [
    "DEBIAN_PSEUDO_DIR", "Place", "Resolved", "cut_short", "resolve_pseudos", "search_places",
]

DEBIAN_PSEUDO_DIR = Path("/usr/share/espresso/pseudo")


@dataclass(frozen=True)
class Place:
    """One place searched: what it is (``label``) and its directory (None when unset)."""

    label: str
    path: Path | None

    def describe(self) -> str:
        """``label (directory)``, or ``label (not set)``."""
        if self.path is None:
            return f"{self.label} (not set)"
        if str(self.path) == self.label:
            return self.label
        return f"{self.label} ({self.path})"


@dataclass(frozen=True)
class Resolved:
    """Where each pseudopotential file of an input comes from.

    ``files`` maps a file name to its path; ``generated`` lists the names that a real run
    will generate first (their path is where they will be written).
    """

    files: Mapping[str, Path]
    generated: tuple[str, ...] = ()


def search_places(input_dir: Path | None, option_dir: Path | None) -> tuple[Place, ...]:
    """The places searched, in order (see the module docstring): pw.x's defaults only when
    the input names no ``pseudo_dir`` (``input_dir`` None)."""
    named = (Place("the input's pseudo_dir", input_dir),
             Place("the option pseudo_dir", option_dir))
    if input_dir is not None:
        return named
    env = os.environ.get("ESPRESSO_PSEUDO")
    return (
        *named,
        Place("$ESPRESSO_PSEUDO", Path(env) if env else None),
        Place("~/espresso/pseudo", Path.home() / "espresso" / "pseudo"),
        Place(str(DEBIAN_PSEUDO_DIR), DEBIAN_PSEUDO_DIR),
    )


def resolve_pseudos(inp: PwInput, option_dir: Path | None, *, generate: bool) -> Resolved:
    """Find every pseudopotential of ``inp``; generate the project's own ones when
    ``generate`` (a real run). Raises :class:`WorkloadError` naming every place looked at
    for the first file found nowhere."""
    # imported here, not with the package: ``python -m tunelab.workloads.qe.pseudo`` (the
    # set-up's command) would otherwise find the module imported before it runs (runpy's
    # RuntimeWarning "… may result in unpredictable behaviour")
    from tunelab.workloads.qe.pseudo import GENERATED, ensure_pseudo, pseudo_cache_dir

    _check_pseudo_dir(inp)
    places = search_places(inp.pseudo_dir, option_dir)
    files: dict[str, Path] = {}
    generated: list[str] = []
    for species in inp.species:
        name = species.pseudo
        if name in files:
            continue
        found = next((p.path / name for p in places
                      if p.path is not None and _is_file(p.path / name)), None)
        if found is None and name in GENERATED:
            found = pseudo_cache_dir() / name
            if generate:
                found = ensure_pseudo(name)
            elif not found.is_file():
                generated.append(name)
        odd = None if found is not None else next(
            (p.path / name for p in places
             if p.path is not None and _lexists(p.path / name)), None)
        if odd is not None:
            raise WorkloadError(
                f"pseudopotential {shorten(name, 80)!r} of species "
                f"{shorten(species.label, 60)!r} named in {inp.path}: {odd} is not a regular "
                "file (a FIFO, a device, a directory, or a link to nothing or to itself)")
        if found is None:
            looked = "; ".join(p.describe() for p in places)
            if inp.pseudo_dir is not None:
                hint = (" (pw.x's defaults $ESPRESSO_PSEUDO, ~/espresso/pseudo and "
                        f"{DEBIAN_PSEUDO_DIR} are searched only for an input that names no "
                        "pseudo_dir)")
            elif not DEBIAN_PSEUDO_DIR.is_dir():
                hint = " (Debian's quantum-espresso-data installs the last)"
            else:
                hint = ""
            raise WorkloadError(
                f"pseudopotential {shorten(name, 80)!r} of species "
                f"{shorten(species.label, 60)!r} named in {inp.path} is in none of the places "
                f"searched, in order: {looked}{hint}"
            )
        if name not in generated:
            cut = cut_short(found)
            if cut is not None:
                raise WorkloadError(
                    f"pseudopotential {name!r} of species {species.label!r} ({found}) {cut}")
        files[name] = found
    return Resolved(files, tuple(generated))


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False for a name the file system refuses (too long)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _lexists(path: Path) -> bool:
    """Whether anything, even a dangling link, has this name (False for a refused name)."""
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):
        return False


def _check_pseudo_dir(inp: PwInput) -> None:
    """Refuse a ``pseudo_dir`` the input names that is not a directory here.

    Searching on past it would take a file of the same name from a later place (often
    Debian's directory) without a word, while the input's author meant another: typically a
    relative ``pseudo_dir`` written for the directory pw.x is started in, which tunelab
    takes from the input file's directory (every run reads the staged copy of what was
    found, never the input's ``pseudo_dir`` itself).
    """
    if inp.pseudo_dir is None:
        return
    try:
        if inp.pseudo_dir.is_dir():
            return
    except OSError:  # a name too long for the file system: no directory either
        pass
    named = inp.value("control", "pseudo_dir")
    where = f"{inp.path}:{inp.pseudo_dir_line}" if inp.pseudo_dir_line else str(inp.path)
    relative = "" if Path(os.path.expanduser(named)).is_absolute() else (
        f" ({shorten(str(inp.pseudo_dir), 120)}: tunelab takes a relative pseudo_dir from "
        "the input file's directory, not from the directory a run starts in)")
    raise WorkloadError(
        f"{where}: pseudo_dir {shorten(named, 80)!r} is not a directory{relative}; name "
        "the directory "
        "that holds the pseudopotentials (absolute, or relative to the input file), or "
        "leave pseudo_dir out to search the option pseudo_dir and pw.x's defaults")


UPF_TAIL_BYTES = 4096
"""How much of a file's end :func:`cut_short` reads for the closing ``</UPF>`` tag."""


def cut_short(path: Path) -> str | None:
    """Why the pseudopotential file at ``path`` is incomplete (empty, or a UPF v2 file
    without its closing ``</UPF>`` tag: a copy or download cut off) or too large to copy
    into every run (``LIMITS.pseudo_file_bytes``), None when it looks whole. Other formats
    are not judged. Reads at most a few kilobytes."""
    try:
        with path.open("rb") as handle:
            head = handle.read(512)
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(size - UPF_TAIL_BYTES, 0))
            tail = handle.read()
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    dies = ": pw.x would die reading it ('Fortran runtime error: End of file'); copy or " \
        "download it again"
    if size == 0:
        return "is empty" + dies
    if size > LIMITS.pseudo_file_bytes:
        return (f"is {size:,} bytes, more than the limit of {LIMITS.pseudo_file_bytes >> 20} "
                "MiB for a pseudopotential: every run would get a copy of it")
    if b"<UPF version=" in head and b"</UPF>" not in tail:
        return (f"is cut short: a UPF file ends with </UPF>, this one stops after {size:,} "
                "bytes" + dies)
    return None
