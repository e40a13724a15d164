"""Pseudopotentials the project generates itself with Quantum ESPRESSO's ``ld1.x``.

Debian's ``quantum-espresso-data`` ships no cerium pseudopotential, so the CeO2 example uses a
PAW Ce generated here from :data:`CE_LD1_INPUT` (scalar-relativistic PBE, 4f¹ frozen in the
core, 11 valence electrons: 5s² 5p⁶ 5d¹ 6s²; 6p as an unbound projector). That is a test
potential for timing studies, not a production one.

ld1.x 6.7 writes some numeric records (``PP_MULTIPOLES``) on one line of over 4000 characters,
and pw.x 6.7 refuses to read lines longer than 1000 characters ("file … not readable"), so
:func:`rewrap_long_lines` splits such lines into a few numbers per line.

Run ``python -m tunelab.workloads.qe.pseudo --ensure`` (idempotent) to create the file in
:func:`pseudo_cache_dir`; the ``qe`` workload also creates it on demand when an input names it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tunelab.errors import WorkloadError

__all__ = [
    "CE_LD1_INPUT",
    "CE_PSEUDO",
    "GENERATED",
    "ensure_pseudo",
    "generate_pseudo",
    "main",
    "pseudo_cache_dir",
    "rewrap_long_lines",
]

CE_PSEUDO = "Ce.pbe-spdn4fc-kjpaw_tunelab.UPF"

CE_LD1_INPUT = f"""\
&input
  title = 'Ce',
  zed = 58.0,
  rel = 1,
  config = '[Xe] 4f1 5d1 6s2 6p0',
  iswitch = 3,
  dft = 'PBE'
/
&inputp
  lpaw = .true.,
  pseudotype = 3,
  file_pseudopw = '{CE_PSEUDO}',
  author = 'tunelab (generated with ld1.x; 4f in the core)',
  lloc = -1,
  rcloc = 2.1,
  which_augfun = 'PSQ',
  rmatch_augfun_nc = .true.,
  nlcc = .true.,
  new_core_ps = .true.,
  rcore = 1.4,
  tm = .true.
/
6
5S  1  0  2.00  0.00  1.30  1.60  0.0
6S  2  0  2.00  0.00  1.30  1.60  0.0
5P  2  1  6.00  0.00  1.40  1.80  0.0
6P  3  1  0.00  0.00  1.40  1.80  0.0
5D  3  2  1.00  0.00  1.50  2.00  0.0
5D  3  2  0.00  0.10  1.50  2.00  0.0
"""

#: File name -> ld1.x input of every pseudopotential the project can generate.
GENERATED: dict[str, str] = {CE_PSEUDO: CE_LD1_INPUT}

MAX_LINE = 1000
LD1_PACKAGE = "quantum-espresso"


def pseudo_cache_dir() -> Path:
    """Where generated pseudopotentials live: ``$TUNELAB_PSEUDO_DIR``, else
    ``$XDG_CACHE_HOME/tunelab/pseudo``, else ``~/.cache/tunelab/pseudo``."""
    if os.environ.get("TUNELAB_PSEUDO_DIR"):
        return Path(os.environ["TUNELAB_PSEUDO_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tunelab" / "pseudo"


def _is_numeric(tokens: Sequence[str]) -> bool:
    try:
        for tok in tokens:
            float(tok.replace("D", "E").replace("d", "e"))
    except ValueError:
        return False
    return bool(tokens)


def rewrap_long_lines(text: str, limit: int = MAX_LINE, per_line: int = 4) -> str:
    """Split every purely numeric line longer than ``limit`` characters into lines of
    ``per_line`` numbers. Other lines are left untouched."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        tokens = body.split()
        if len(body) > limit and _is_numeric(tokens):
            for i in range(0, len(tokens), per_line):
                out.append("  " + "  ".join(tokens[i : i + per_line]) + "\n")
        else:
            out.append(line)
    return "".join(out)


def _longest_line(path: Path) -> int:
    with path.open() as fh:
        return max((len(line.rstrip("\r\n")) for line in fh), default=0)


def generate_pseudo(name: str, dest_dir: Path, ld1: str = "ld1.x") -> Path:
    """Run ld1.x on the project's input for ``name``, re-wrap long lines and write
    ``dest_dir/name`` (atomically) next to the input used, ``name.ld1.in``."""
    if name not in GENERATED:
        raise WorkloadError(
            f"no generator for pseudopotential {name!r}; known: {', '.join(GENERATED)}"
        )
    exe = shutil.which(ld1)
    if exe is None:
        raise WorkloadError(
            f"{ld1!r} is not installed or not on PATH; install the Debian package "
            f"{LD1_PACKAGE!r} (apt-get install -y {LD1_PACKAGE})"
        )
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    ld1_input = GENERATED[name]
    with tempfile.TemporaryDirectory(prefix="tunelab-ld1-") as tmp:
        try:
            proc = subprocess.run(
                [exe], input=ld1_input, cwd=tmp, capture_output=True, text=True,
                timeout=300, check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WorkloadError(f"ld1.x could not generate {name}: {exc}") from exc
        produced = Path(tmp) / name
        if proc.returncode != 0 or not produced.is_file():
            tail = " ".join((proc.stdout + proc.stderr).split()[-30:])
            raise WorkloadError(f"ld1.x failed to generate {name} (rc {proc.returncode}): {tail}")
        text = rewrap_long_lines(produced.read_text())
    target = dest_dir / name
    part = target.with_name(target.name + f".part{os.getpid()}")
    part.write_text(text)
    os.replace(part, target)
    (dest_dir / f"{name}.ld1.in").write_text(ld1_input)
    return target


def ensure_pseudo(name: str = CE_PSEUDO, dest_dir: Path | None = None, ld1: str = "ld1.x",
                  force: bool = False) -> Path:
    """The generated pseudopotential ``name`` in ``dest_dir`` (default
    :func:`pseudo_cache_dir`), generated only when missing, stale (made from another input)
    or holding lines pw.x cannot read."""
    dest_dir = Path(dest_dir) if dest_dir is not None else pseudo_cache_dir()
    target = dest_dir / name
    stamp = dest_dir / f"{name}.ld1.in"
    if (
        not force
        and target.is_file()
        and stamp.is_file()
        and stamp.read_text() == GENERATED.get(name)
        and _longest_line(target) <= MAX_LINE
    ):
        return target
    return generate_pseudo(name, dest_dir, ld1)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m tunelab.workloads.qe.pseudo [--ensure] [--dir D] [--force]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tunelab.workloads.qe.pseudo",
        description="Generate the project's pseudopotentials (Ce PAW) with ld1.x.",
    )
    parser.add_argument("--ensure", action="store_true",
                        help="generate only what is missing (the default behaviour)")
    parser.add_argument("--force", action="store_true", help="generate even if present")
    parser.add_argument("--dir", type=Path, default=None,
                        help="output directory (default: $TUNELAB_PSEUDO_DIR or "
                             "~/.cache/tunelab/pseudo)")
    parser.add_argument("--ld1", default="ld1.x", help="path of ld1.x")
    args = parser.parse_args(argv)
    try:
        for name in GENERATED:
            start = time.perf_counter()
            path = ensure_pseudo(name, args.dir, args.ld1, force=args.force)
            print(f"{path}  ({time.perf_counter() - start:.2f} s)")
    except WorkloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
