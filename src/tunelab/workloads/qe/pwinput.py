"""Read a pw.x input file and stage a private copy of it for one run.

pw.x inputs are Fortran namelists (``&CONTROL``, ``&SYSTEM``, ``&ELECTRONS``, …) followed by
cards (``ATOMIC_SPECIES``, ``ATOMIC_POSITIONS``, ``K_POINTS``, …). tunelab needs only a few
facts from them: the pseudopotential files and where they live, and the number of k-points
(pw.x cannot use more pools than k-points). :func:`stage_input` writes a copy of the input
into a run directory with ``pseudo_dir`` and ``outdir`` pointing inside it, and copies the
pseudopotentials there, so that concurrent runs never share scratch files.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tunelab.errors import WorkloadError

__all__ = [
    "STAGED_INPUT",
    "KPoints",
    "PwInput",
    "Species",
    "count_kpoints_with_pw",
    "read_pw_input",
    "STAGED_OUTDIR",
    "STAGED_PSEUDO",
    "rewrite_control",
    "stage_input",
]

_NAMELIST = re.compile(r"^[ \t]*&(\w+)(.*?)^[ \t]*/[ \t]*$", re.MULTILINE | re.DOTALL)
_ASSIGN = re.compile(
    r"(?P<key>\w+(?:\(\s*\d+(?:\s*,\s*\d+)*\s*\))?)\s*=\s*"
    r"(?P<val>'(?:[^']|'')*'|\"[^\"]*\"|[^,\s/]+)"
)
_CARDS = (
    "ATOMIC_SPECIES", "ATOMIC_POSITIONS", "K_POINTS", "CELL_PARAMETERS", "OCCUPATIONS",
    "CONSTRAINTS", "ATOMIC_FORCES", "ATOMIC_VELOCITIES", "ADDITIONAL_K_POINTS", "SOLVENTS",
    "HUBBARD",
)
STAGED_INPUT = "pw.in"
STAGED_PSEUDO = "pseudo"
STAGED_OUTDIR = "out"


@dataclass(frozen=True)
class Species:
    """One line of ATOMIC_SPECIES: label, mass and pseudopotential file name."""

    label: str
    mass: float
    pseudo: str


@dataclass(frozen=True)
class KPoints:
    """The K_POINTS card: its mode, and for ``automatic`` the grid and shift.

    ``count`` is what the input alone says: the listed points for explicit lists (band paths
    expanded), 1 for ``gamma``, and the full grid ``nk1*nk2*nk3`` for automatic grids — an
    upper bound, since pw.x reduces the grid by symmetry (:func:`count_kpoints_with_pw`).
    """

    mode: str
    count: int
    grid: tuple[int, int, int] | None = None
    shift: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class PwInput:
    """The facts tunelab reads from a pw.x input file."""

    path: Path
    text: str
    namelists: dict[str, dict[str, str]]
    species: tuple[Species, ...]
    kpoints: KPoints
    pseudo_dir: Path
    fallback_dirs: tuple[Path, ...] = field(default=())
    cards: dict[str, tuple[str, list[str]]] = field(default_factory=dict, repr=False)

    @property
    def nspin(self) -> int:
        """``nspin`` of &SYSTEM (1 when absent)."""
        try:
            return int(self.namelists.get("system", {}).get("nspin", "1"))
        except ValueError:
            return 1

    @property
    def nk_bound(self) -> int:
        """K-points pw.x distributes over pools, from the input alone (an upper bound for
        automatic grids); doubled for spin-polarised (``nspin = 2``) runs, as pw.x does."""
        return self.kpoints.count * (2 if self.nspin == 2 else 1)

    def pseudo_paths(self) -> list[Path]:
        """The pseudopotential file of every species: in ``pseudo_dir``, else in the first of
        ``fallback_dirs`` that holds it, else the (missing) path in ``pseudo_dir``."""
        paths = []
        for s in self.species:
            for d in (self.pseudo_dir, *self.fallback_dirs):
                if (d / s.pseudo).is_file():
                    paths.append(d / s.pseudo)
                    break
            else:
                paths.append(self.pseudo_dir / s.pseudo)
        return paths

    def missing_pseudos(self) -> list[Path]:
        """Pseudopotential files the input names that exist nowhere."""
        return [p for p in self.pseudo_paths() if not p.is_file()]


def _strip_comments(text: str) -> str:
    out = []
    for line in text.splitlines():
        quote = None
        for i, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif ch in "!#":
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace("''", "'")
    return value


def _cards(text: str) -> dict[str, tuple[str, list[str]]]:
    """Card name -> (option, following non-empty lines until the next card)."""
    body = _NAMELIST.sub("", text)
    cards: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for raw in body.splitlines():
        line = raw.strip()
        if not line:
            continue
        word = line.split()[0].upper()
        if word in _CARDS:
            current = word
            option = line[len(word):].strip().strip("{}()").strip().lower()
            cards[current] = (option, [])
        elif current is not None:
            cards[current][1].append(line)
    return cards


def _kpoints(path: Path, cards: dict[str, tuple[str, list[str]]]) -> KPoints:
    if "K_POINTS" not in cards:
        return KPoints("gamma", 1)  # pw.x's default is the Gamma point alone
    mode, lines = cards["K_POINTS"]
    mode = mode or "tpiba"
    try:
        if mode == "gamma":
            return KPoints("gamma", 1)
        if mode == "automatic":
            nums = [int(x) for x in lines[0].split()[:6]]
            grid = (nums[0], nums[1], nums[2])
            shift = (nums[3], nums[4], nums[5])
            if min(grid) < 1:
                raise ValueError("grid sizes must be positive")
            return KPoints("automatic", grid[0] * grid[1] * grid[2], grid, shift)
        nks = int(lines[0].split()[0])
        points = lines[1 : 1 + nks]
        if len(points) < nks:
            raise ValueError(f"{nks} points announced, {len(points)} listed")
        if mode.endswith("_b"):  # band path: weight = number of points to the next vertex
            weights = [int(float(p.split()[3])) for p in points[:-1]]
            return KPoints(mode, sum(weights) + 1)
        return KPoints(mode, nks)
    except (IndexError, ValueError) as exc:
        raise WorkloadError(f"{path}: cannot read the K_POINTS {mode} card: {exc}") from exc


def read_pw_input(
    path: Path, pseudo_dir: Path | None = None, fallback_dirs: Sequence[Path] = ()
) -> PwInput:
    """Read a pw.x input file; ``pseudo_dir`` overrides the one the input names, and
    ``fallback_dirs`` are searched for pseudopotentials ``pseudo_dir`` lacks.

    Without an override, pseudo_dir follows pw.x: the input's ``pseudo_dir`` (relative paths
    are taken relative to the input file's directory), else ``$ESPRESSO_PSEUDO``, else
    ``~/espresso/pseudo``. Raises :class:`WorkloadError` for a missing or unreadable file and
    for a file that is not a pw.x input.
    """
    path = Path(path)
    if not path.is_file():
        raise WorkloadError(f"pw.x input file {str(path)!r} does not exist")
    try:
        raw = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"pw.x input file {str(path)!r} cannot be read: {exc}") from exc
    text = _strip_comments(raw)
    namelists: dict[str, dict[str, str]] = {}
    for m in _NAMELIST.finditer(text):
        values = {
            a.group("key").lower().replace(" ", ""): _unquote(a.group("val"))
            for a in _ASSIGN.finditer(m.group(2))
        }
        namelists[m.group(1).lower()] = values
    cards = _cards(text)
    if "system" not in namelists or "ATOMIC_SPECIES" not in cards:
        raise WorkloadError(
            f"{path} is not a pw.x input: it needs a &SYSTEM namelist and an "
            "ATOMIC_SPECIES card"
        )
    species = []
    for line in cards["ATOMIC_SPECIES"][1]:
        parts = line.split()
        if len(parts) < 3:
            raise WorkloadError(f"{path}: bad ATOMIC_SPECIES line {line!r}")
        try:
            mass = float(parts[1].replace("d", "e").replace("D", "E"))
        except ValueError as exc:
            raise WorkloadError(f"{path}: bad mass in ATOMIC_SPECIES line {line!r}") from exc
        species.append(Species(parts[0], mass, parts[2]))
    if pseudo_dir is None:
        named = namelists.get("control", {}).get("pseudo_dir")
        if named:
            pseudo_dir = Path(os.path.expanduser(named))
            if not pseudo_dir.is_absolute():
                pseudo_dir = path.parent / pseudo_dir
        elif os.environ.get("ESPRESSO_PSEUDO"):
            pseudo_dir = Path(os.environ["ESPRESSO_PSEUDO"])
        else:
            pseudo_dir = Path.home() / "espresso" / "pseudo"
    return PwInput(
        path=path,
        text=raw,
        namelists=namelists,
        species=tuple(species),
        kpoints=_kpoints(path, cards),
        pseudo_dir=Path(pseudo_dir),
        fallback_dirs=tuple(Path(d) for d in fallback_dirs),
        cards=cards,
    )


_CONTROL_KEYS = re.compile(
    r"\b(?:pseudo_dir|outdir|wfcdir)\s*=\s*(?:'(?:[^']|'')*'|\"[^\"]*\"|[^,\s/]+)[ \t]*,?[ \t]*",
    re.IGNORECASE,
)


def rewrite_control(text: str, pseudo_dir: str, outdir: str) -> str:
    """The input text with ``pseudo_dir`` and ``outdir`` set (and ``wfcdir`` dropped) in
    &CONTROL, which is added when the input has none."""
    settings = f"  pseudo_dir = '{pseudo_dir}'\n  outdir = '{outdir}'\n"
    m = re.search(r"^[ \t]*&control\b(.*?)^[ \t]*/[ \t]*$", text,
                  re.IGNORECASE | re.MULTILINE | re.DOTALL)
    if m is None:
        return f"&CONTROL\n{settings}/\n{text}"
    body = _CONTROL_KEYS.sub("", m.group(1))  # includes the rest of the &CONTROL line
    first, _, rest = body.partition("\n")
    first = f"\n{first.strip()}\n" if first.strip() else "\n"
    rest = "".join(line for line in rest.splitlines(keepends=True) if line.strip())
    return text[: m.start(1)] + first + settings + rest + text[m.end(1):]


def stage_input(inp: PwInput, run_dir: Path, name: str = STAGED_INPUT) -> Path:
    """Write a private copy of the input into ``run_dir`` and copy its pseudopotentials.

    The copy's ``pseudo_dir`` is ``run_dir/pseudo`` and its ``outdir`` ``run_dir/out``
    (absolute paths). Returns the path of the staged input.
    """
    run_dir = Path(run_dir)
    pseudo = run_dir / STAGED_PSEUDO
    pseudo.mkdir(parents=True, exist_ok=True)
    (run_dir / STAGED_OUTDIR).mkdir(exist_ok=True)
    for src in inp.pseudo_paths():
        if not src.is_file():
            raise WorkloadError(f"pseudopotential {str(src)!r} named in {inp.path} is missing")
        dst = pseudo / src.name
        if not dst.exists():
            shutil.copyfile(src, dst)
    staged = run_dir / name
    staged.write_text(
        rewrite_control(inp.text, str(pseudo.resolve()) + "/",
                        str((run_dir / STAGED_OUTDIR).resolve()) + "/")
    )
    return staged


def _stop_before_scf(text: str) -> str:
    """The input with ``electron_maxstep = 0`` in &ELECTRONS (added when absent)."""
    text = re.sub(r"\belectron_maxstep\s*=\s*[^,\s/]+\s*,?", "", text, flags=re.IGNORECASE)
    flags = re.IGNORECASE | re.MULTILINE
    if re.search(r"^[ \t]*&electrons\b", text, flags):
        return re.sub(r"^([ \t]*&electrons\b[^\n]*\n)", r"\1  electron_maxstep = 0\n", text,
                      count=1, flags=flags)
    m = re.search(r"^[ \t]*&system\b.*?^[ \t]*/[ \t]*$", text, flags | re.DOTALL)
    if m is None:
        return text
    return text[: m.end()] + "\n&ELECTRONS\n  electron_maxstep = 0\n/" + text[m.end():]


_NK_USED = re.compile(r"number of k points=\s*(\d+)")


def count_kpoints_with_pw(inp: PwInput, pw: str = "pw.x", timeout: float = 120.0) -> int | None:
    """The number of k-points pw.x really uses (after symmetry reduction; doubled for
    ``nspin = 2``), from a serial pw.x run of the input stopped before its first SCF step
    (``electron_maxstep = 0``). None when pw.x cannot be run or prints no count."""
    exe = shutil.which(pw)
    if exe is None:
        return None
    with tempfile.TemporaryDirectory(prefix="tunelab-qe-nk-") as tmp:
        try:
            staged = stage_input(inp, Path(tmp), "probe.in")
        except WorkloadError:
            return None
        text = _stop_before_scf(staged.read_text())
        staged.write_text(text)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        try:
            proc = subprocess.run(
                [exe, "-inp", staged.name], cwd=tmp, env=env, capture_output=True,
                text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        found = _NK_USED.findall(proc.stdout)
        return int(found[0]) if found else None
