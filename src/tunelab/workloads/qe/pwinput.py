"""Read a pw.x input file and stage a private copy of it for one run.

pw.x inputs are Fortran namelists (``&CONTROL``, ``&SYSTEM``, ``&ELECTRONS``, …) followed by
cards (``ATOMIC_SPECIES``, ``ATOMIC_POSITIONS``, ``K_POINTS``, …). tunelab reads the facts it
needs from them: the pseudopotential files, the k-points (see :mod:`.kpoints`), whether the
run reads the data of an earlier one (nscf, bands, restarts), its ``prefix`` and
``conv_thr``. :func:`stage_input` writes a copy of the input into a run directory with
``pseudo_dir`` and ``outdir`` pointing inside it, and copies the pseudopotentials there, so
that concurrent runs never share scratch files.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tunelab.errors import WorkloadError
from tunelab.inputfile import read_input_text
from tunelab.workloads.qe.fortran import fortran_bool
from tunelab.workloads.qe.kpoints import KPointCount, compute_kpoints, fortran_float

__all__ = [
    "DEFAULT_CONV_THR",
    "MAX_STAR",
    "STAGED_INPUT",
    "STAGED_OUTDIR",
    "STAGED_PSEUDO",
    "KPoints",
    "PwInput",
    "Species",
    "read_pw_input",
    "rewrite_control",
    "stage_input",
]

DEFAULT_CONV_THR = 1e-6
"""pw.x's default ``conv_thr`` (Ry)."""

_NAMELIST_START = re.compile(r"^[ \t]*&(\w+)", re.MULTILINE)
_NAMELIST_BODY = re.compile(r"""(?:[^'"!#/]++|'[^']*+'|"[^"]*+"|[!#][^\n]*+)*+/""")
"""A namelist's body up to its closing ``/``: the first one outside quotes and comments."""
_COMMENT = re.compile(r"""('[^']*+(?:'|$)|"[^"]*+(?:"|$))|[!#].*""")
"""A quoted string (kept: group 1) or a comment (dropped), within one line."""
_ASSIGN = re.compile(
    r"(?P<key>\w+(?:\(\s*\d+(?:\s*,\s*\d+)*\s*\))?)\s*=\s*"
    r"(?P<val>'(?:[^']|'')*'|\"[^\"]*\"|[^,\s/]+)"
)
_CARDS = (
    "ATOMIC_SPECIES", "ATOMIC_POSITIONS", "K_POINTS", "CELL_PARAMETERS", "OCCUPATIONS",
    "CONSTRAINTS", "ATOMIC_FORCES", "ATOMIC_VELOCITIES", "ADDITIONAL_K_POINTS", "SOLVENTS",
    "HUBBARD",
)
MAX_STAR = 48
"""The most images a k-point has under a lattice's symmetry (the cube's 48 operations)."""
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
    expanded, a ``_c`` plane as its w2×w3 points), 1 for ``gamma``, and the full grid
    ``nk1*nk2*nk3`` for automatic grids. pw.x reduces a grid by symmetry and may add
    images to a list (:meth:`PwInput.count_kpoints`; :attr:`PwInput.nk_bound` bounds both).
    """

    mode: str
    count: int
    grid: tuple[int, int, int] | None = None
    shift: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class PwInput:
    """The facts tunelab reads from a pw.x input file.

    ``pseudo_dir`` is the directory the input names (relative ones taken from the input
    file's directory), None when it names none, and ``pseudo_dir_line`` the line of the file
    that names it; where each pseudopotential is really found is decided by
    :mod:`.pseudo_search`.
    """

    path: Path
    text: str
    namelists: dict[str, dict[str, str]]
    species: tuple[Species, ...]
    kpoints: KPoints
    pseudo_dir: Path | None
    cards: dict[str, tuple[str, list[str]]] = field(default_factory=dict, repr=False)
    pseudo_dir_line: int = 0

    def value(self, namelist: str, key: str, default: str = "") -> str:
        """A namelist variable as written (quotes removed), ``default`` when absent."""
        return self.namelists.get(namelist, {}).get(key.lower(), default)

    @property
    def nspin(self) -> int:
        """``nspin`` of &SYSTEM (1 when absent)."""
        try:
            return int(self.value("system", "nspin", "1"))
        except ValueError:
            return 1

    @property
    def lsda(self) -> bool:
        """A collinear spin-polarised run (``nspin = 2``): pw.x prints the k-points of one
        spin but distributes those of both."""
        return self.nspin == 2

    @property
    def calculation(self) -> str:
        """``calculation`` of &CONTROL, lower case (``scf`` when absent)."""
        return self.value("control", "calculation", "scf").lower()

    @property
    def prefix(self) -> str:
        """``prefix`` of &CONTROL (pw.x's default ``pwscf``)."""
        return self.value("control", "prefix", "pwscf")

    @property
    def conv_thr(self) -> float:
        """``conv_thr`` of &ELECTRONS in Ry (pw.x's default 1e-6 when absent)."""
        try:
            return fortran_float(self.value("electrons", "conv_thr", str(DEFAULT_CONV_THR)))
        except ValueError:
            return DEFAULT_CONV_THR

    @property
    def reads_previous_run(self) -> str | None:
        """Why this run needs the data of an earlier one in outdir (``prefix.save`` and
        friends), e.g. ``"calculation='nscf'"``; None for a run that starts from scratch."""
        if self.calculation in ("nscf", "bands"):
            return f"calculation='{self.calculation}'"
        if self.value("control", "restart_mode", "from_scratch").lower() == "restart":
            return "restart_mode='restart'"
        for key in ("startingpot", "startingwfc"):
            if self.value("electrons", key).lower() == "file":
                return f"{key}='file'"
        return None

    @property
    def nk_bound(self) -> int:
        """An upper bound of the k-points pw.x distributes over pools, from the card alone
        (used where the symmetry rules do not model the input and pw.x was not run).

        An automatic grid gives at most its full grid (Berry-phase strings: the grid
        across the string direction times ``nppstr``). An explicit list gives itself in a
        ``bands`` run, and otherwise up to :data:`MAX_STAR` points per listed point: pw.x
        adds the images of each point under the lattice symmetries the crystal lacks (an
        orthorhombic distortion of a cubic cell turned 3 listed points into 5). Doubled for
        spin-polarised (``nspin = 2``) runs, as pw.x distributes both spins.
        """
        k = self.kpoints
        count = k.count
        if k.mode == "automatic" and k.grid is not None and fortran_bool(
                self.value("control", "lberry")):
            gdir, nppstr = self.value("control", "gdir"), self.value("control", "nppstr")
            if gdir in ("1", "2", "3") and nppstr.isdigit():
                count = count // k.grid[int(gdir) - 1] * max(int(nppstr), 1)
        elif k.mode not in ("automatic", "gamma") and self.calculation != "bands":
            count *= MAX_STAR
        return count * (2 if self.lsda else 1)

    def count_kpoints(self) -> KPointCount | None:
        """The k-points by pw.x's own rules (:func:`.kpoints.compute_kpoints`), or None
        where the input uses something the rules do not model."""
        return compute_kpoints(self.namelists, self.cards, [s.label for s in self.species])


@dataclass(frozen=True)
class _Span:
    """Where one namelist is in the text: ``&name`` at ``start``, its body from ``body`` to
    the closing ``/`` at ``slash``."""

    name: str
    start: int
    body: int
    slash: int


def _namelists(text: str) -> list[_Span]:
    """The namelists of ``text`` (comments included), each from ``&name`` at the start of a
    line to its closing ``/``: the first one outside quotes and comments, on a line of its
    own or on the same line as the values (``&CONTROL calculation='scf' /``), as gfortran
    reads them. A namelist without its ``/`` is left out (it then reads as no namelist)."""
    spans: list[_Span] = []
    pos = 0
    while (m := _NAMELIST_START.search(text, pos)) is not None:
        body = _NAMELIST_BODY.match(text, m.end())
        if body is None:  # no closing / (or a quote that never closes)
            break
        i = body.end() - 1
        spans.append(_Span(m.group(1), m.start(), m.end(), i))
        pos = i + 1
    return spans


def _strip_comments(text: str) -> str:
    """``text`` without its comments (``!`` or ``#`` to the end of the line, outside quotes;
    a quote left open runs to the end of its line)."""
    return "\n".join(_COMMENT.sub(lambda m: m.group(1) or "", line)
                     for line in text.splitlines())


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace("''", "'")
    return value


def _cards(text: str) -> dict[str, tuple[str, list[str]]]:
    """Card name -> (option, following non-empty lines until the next card)."""
    body, end = [], 0
    for span in _namelists(text):
        body.append(text[end:span.start])
        end = span.slash + 1
    body.append(text[end:])
    cards: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for raw in "".join(body).splitlines():
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
        if mode.endswith("_c") and nks == 3:  # a plane: the origin, then two edges of
            # weight w2 and w3 points (pw.x 6.7: 'tpiba_c' with 4 and 4 gives 16 points)
            edges = [int(float(p.split()[3])) for p in points[1:]]
            return KPoints(mode, max(edges[0], 1) * max(edges[1], 1))
        return KPoints(mode, nks)
    except (IndexError, ValueError) as exc:
        raise WorkloadError(f"{path}: cannot read the K_POINTS {mode} card: {exc}") from exc


def read_pw_input(path: Path) -> PwInput:
    """Read a pw.x input file.

    Raises :class:`WorkloadError` for a missing or unreadable file and for a file that is
    not a pw.x input.
    """
    path = Path(path)
    raw = read_input_text(path, f"pw.x input file {str(path)!r}", error=WorkloadError)
    text = _strip_comments(raw)
    namelists: dict[str, dict[str, str]] = {}
    lines: dict[tuple[str, str], int] = {}
    number, counted = 1, 0  # the line number at offset ``counted``: counted once, forward
    for span in _namelists(text):
        values = {}
        for a in _ASSIGN.finditer(text, span.body, span.slash):
            key = a.group("key").lower().replace(" ", "")
            values[key] = _unquote(a.group("val"))
            number += text.count("\n", counted, a.start())
            counted = a.start()
            lines[span.name.lower(), key] = number
        namelists[span.name.lower()] = values
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
    pseudo_dir = None
    named = namelists.get("control", {}).get("pseudo_dir")
    if named:
        # where the kernel finds it, as it is shown: '../pp' from inputs/ is printed as
        # the folder itself, not 'inputs/../pp' (realpath, unlike resolve, ends a loop)
        pseudo_dir = Path(os.path.realpath(path.parent / os.path.expanduser(named)))
    return PwInput(
        path=path,
        text=raw,
        namelists=namelists,
        species=tuple(species),
        kpoints=_kpoints(path, cards),
        pseudo_dir=pseudo_dir,
        cards=cards,
        pseudo_dir_line=lines.get(("control", "pseudo_dir"), 0),
    )


_CONTROL_KEYS = re.compile(
    r"\b(?:pseudo_dir|outdir|wfcdir)\s*=\s*(?:'(?:[^']|'')*'|\"[^\"]*\"|[^,\s/]+)[ \t]*,?[ \t]*",
    re.IGNORECASE,
)


def rewrite_control(text: str, pseudo_dir: str, outdir: str) -> str:
    """The input text with ``pseudo_dir`` and ``outdir`` set (and ``wfcdir`` dropped) in
    &CONTROL, which is added when the input has none."""
    settings = f"  pseudo_dir = '{pseudo_dir}'\n  outdir = '{outdir}'\n"
    control = next((s for s in _namelists(text) if s.name.lower() == "control"), None)
    if control is None:
        return f"&CONTROL\n{settings}/\n{text}"
    # the body includes the rest of the &CONTROL line, and for a namelist closed on a line
    # with values (``… prefix='p' /``) the text before the ``/``, which goes on its own line
    body = _CONTROL_KEYS.sub("", text[control.body:control.slash])
    first, _, rest = body.partition("\n")
    first = f"\n{first.strip()}\n" if first.strip() else "\n"
    rest = "".join(line.rstrip(" \t") + "\n" for line in rest.splitlines() if line.strip())
    return text[:control.body] + first + settings + rest + text[control.slash:]


def stage_input(inp: PwInput, run_dir: Path, pseudos: Mapping[str, Path],
                name: str = STAGED_INPUT, *, relative: bool = False) -> Path:
    """Write a private copy of the input into ``run_dir`` and copy its pseudopotentials
    (``pseudos``: file name -> where it was found) into ``run_dir/pseudo``.

    The copy's ``pseudo_dir`` is ``run_dir/pseudo`` and its ``outdir`` ``run_dir/out``
    (absolute paths; ``out`` may already hold the data of an earlier run), or ``./pseudo/``
    and ``./out/`` with ``relative`` (files that travel with a job script to another
    machine). Returns the path of the staged input.
    """
    run_dir = Path(run_dir)
    pseudo = run_dir / STAGED_PSEUDO
    pseudo.mkdir(parents=True, exist_ok=True)
    (run_dir / STAGED_OUTDIR).mkdir(exist_ok=True)
    for species in inp.species:
        src = pseudos.get(species.pseudo)
        if src is None or not src.is_file():
            raise WorkloadError(
                f"pseudopotential {species.pseudo!r} named in {inp.path} is missing"
            )
        dst = pseudo / species.pseudo
        if not dst.exists():
            shutil.copyfile(src, dst)
    staged = run_dir / name
    if relative:
        where = (f"./{STAGED_PSEUDO}/", f"./{STAGED_OUTDIR}/")
    else:
        where = (str(pseudo.resolve()) + "/", str((run_dir / STAGED_OUTDIR).resolve()) + "/")
    staged.write_text(rewrite_control(inp.text, *where))
    return staged
