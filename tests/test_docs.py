"""Documentation that runs as written: every command block of README.md and docs/ is run
(issue 21, item 5), so that no command, option, file name or sample output can drift from
what tunelab does.

How blocks are found and marked: ``tests/docs_blocks.py``. Each document's runnable blocks
run in order in one scratch directory that holds ``examples/``, ``benchmarks/`` and
``scripts/`` of the repository (linked) and, where a command names it, ``runs/demo``: the
study ``make demo`` leaves (``examples/qe-si.yaml``, real pw.x, two repeats). ``tunelab`` and
``python`` are this interpreter (``.venv/bin/`` shims first on PATH). A command is an argv
list; only a line with a pipe, a redirection, ``$(…)`` or a variable goes to ``bash -c`` with
``set -o pipefail``. Each must exit 0 without a traceback; a command shown with a ``$``
prompt must print every line shown after it (lines with … stand for what is left out).

Blocks marked ``skip`` are checked for what the repository provides instead (``--help``
parses every ``tunelab`` subcommand and option they use) — fast, in every test run; running
the other blocks is ``slow`` (real pw.x, real runs: a few minutes).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.docs_blocks import (
    ROOT,
    SHELL_TOKENS,
    Block,
    Command,
    blocks_of,
    commands_of,
    documents,
)

PY = sys.executable
PYTHONS = ("python", "python3", ".venv/bin/python")
TUNELABS = ("tunelab", ".venv/bin/tunelab")
LINKED = ("examples", "benchmarks", "scripts")


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- what the repository provides: subcommands, options, files ------------------------------


@cache
def _cli() -> Any:
    """The click command tree of ``tunelab``."""
    import typer.main

    from tunelab.cli import app

    return typer.main.get_command(app)


def _options_of(command: Any) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def _option_names(args: list[str]) -> list[str]:
    """The option names among ``args`` (``--x=1`` -> ``--x``; ``-`` alone is a value)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("-") and a != "-"
            and not re.fullmatch(r"-[\d.]+", a)]


def _check_tunelab(args: list[str]) -> list[str]:
    """Problems of ``tunelab ARGS``: an unknown subcommand or option."""
    command, path = _cli(), ["tunelab"]
    rest = list(args)
    while hasattr(command, "commands") and rest and not rest[0].startswith("-"):  # a group
        if rest[0] not in command.commands:
            return [f"{' '.join(path)}: no subcommand {rest[0]!r}"]
        command = command.commands[rest[0]]
        path.append(rest.pop(0))
    known = _options_of(command)
    return [f"{' '.join(path)}: no option {name}" for name in _option_names(rest)
            if name not in known]


@cache
def _help(argv: tuple[str, ...]) -> str:
    res = subprocess.run([PY, *argv, "--help"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env=_quiet_env())
    return res.stdout + res.stderr if res.returncode == 0 else ""


def _check_python(args: list[str]) -> list[str]:
    """Problems of ``python -m MODULE …`` or ``python FILE …``: missing, or an option its
    ``--help`` does not know."""
    if args[:1] == ["-m"] and len(args) > 1:
        target, rest = ("-m", args[1]), args[2:]
        if args[1] == "tunelab":
            return _check_tunelab(rest)
    elif args and args[0].endswith(".py"):
        if not (ROOT / args[0]).is_file():
            return [f"{args[0]}: no such file in the repository"]
        target, rest = (args[0],), args[1:]
    else:
        return []  # python itself: nothing of ours to check
    text = _help(target)
    if not text:
        return [f"python {' '.join(target)} --help fails"]
    return [f"python {' '.join(target)}: no option {name}" for name in _option_names(rest)
            if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)]


def _check_argv(argv: list[str]) -> list[str]:
    """Problems of one command of a block that cannot run here (see the module docstring)."""
    while argv and re.fullmatch(r"[A-Za-z_]\w*=.*", argv[0]):
        argv = argv[1:]  # VAR=value prefixes
    if not argv:
        return []
    program, args = argv[0], argv[1:]
    if program in TUNELABS:
        return _check_tunelab(args)
    if program in PYTHONS:
        return _check_python(args)
    if program == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE)
        return [f"make: no target {t}" for t in args if not t.startswith("-")
                and t not in targets]
    if program == "bash" and args and args[0].startswith("scripts/"):
        return [] if (ROOT / args[0]).is_file() else [f"{args[0]}: no such script"]
    if program.startswith("scripts/"):
        script = ROOT / program
        ok = script.is_file() and os.access(script, os.X_OK)
        return [] if ok else [f"{program}: no such executable script"]
    return []  # a program of the machine or a cluster (module, mpirun, sbatch…)


def check_block(block: Block) -> list[str]:
    """Problems of what the repository provides in ``block``'s commands."""
    problems: list[str] = []
    variables: dict[str, str] = {}
    for command in commands_of(block):
        line = command.line
        for name, value in variables.items():
            line = line.replace(f"${{{name}}}", value).replace(f"${name}", value)
        inner = re.findall(r"\$\((.*?)\)", line)
        try:
            tokens = shlex.split(re.sub(r"\$\((.*?)\)", "", line), comments=True)
        except ValueError as exc:
            problems.append(f"{block.where}: cannot read {line!r}: {exc}")
            continue
        if len(tokens) == 1 and (assign := re.fullmatch(r"([A-Za-z_]\w*)=(.*)", tokens[0])):
            variables[assign.group(1)] = assign.group(2)
            continue
        segments: list[list[str]] = [[]]
        for token in tokens:
            if token in SHELL_TOKENS or token == "&&":
                segments.append([])
            else:
                segments[-1].append(token)
        segments += [shlex.split(text, comments=True) for text in inner]
        for argv in segments:
            if argv and argv[0] == "eval":
                continue  # its $(…) is checked above
            problems += [f"{block.where}: {p}" for p in _check_argv(argv)]
    return problems


@pytest.mark.parametrize("doc", documents(), ids=_id)
def test_every_command_block_runs_or_says_why_not(doc: Path) -> None:
    """A command block is run by the slow test, or marked ``skip (REASON)``; either way what
    it names of tunelab exists (subcommands, options, scripts, files)."""
    problems = []
    for block in blocks_of(doc):
        if block.marker == "skip":
            if not re.fullmatch(r"\(.+\)", block.argument):
                problems.append(f"{block.where}: skip needs a reason: docs-test: skip (…)")
        elif block.marker == "file":
            if not re.fullmatch(r"[\w.-]+", block.argument):
                problems.append(f"{block.where}: file needs a plain name, got "
                                f"{block.argument!r}")
            continue
        if block.is_command:
            problems += check_block(block)
    assert problems == []


def test_the_check_catches_what_drifted() -> None:
    """The checker itself: an option, a subcommand or a script that does not exist."""
    block = Block(ROOT / "README.md", 1, "bash", [
        "tunelab run study.yaml --no-such-flag", "tunelab frobnicate runs/x",
        "python -m tunelab.bench.ddp --model resnet50 --no-such-option 3",
        "scripts/no-such.sh up", "make no-such-target", "tunelab compare runs/a -f json",
        "tunelab export runs/a -f csv -o -"])
    problems = "\n".join(check_block(block))
    for expected in ("tunelab run: no option --no-such-flag", "no subcommand 'frobnicate'",
                     "no option --no-such-option", "scripts/no-such.sh",
                     "no target no-such-target", "tunelab compare: no option -f"):
        assert expected in problems, problems
    assert "tunelab export" not in problems


# --- pages the tool points to ------------------------------------------------------------------


def test_every_workload_has_the_page_its_init_template_names() -> None:
    from tunelab.workload import get_workload
    from tunelab.workloads import available_workloads
    from tunelab.workloads.examples import example_study

    for name in available_workloads():
        cls = get_workload(name)
        named = re.findall(r"docs/workloads/[\w-]+\.md", example_study(cls))
        assert named == [f"docs/workloads/{name}.md"], (name, named)
        assert (ROOT / named[0]).is_file(), f"{named[0]} is named by `tunelab init {name}`"


def test_the_readme_starts_with_two_commands_and_says_how_tunelab_gets_on_the_path() -> None:
    text = (ROOT / "README.md").read_text()
    head = text[:text.index("\n## ")]
    first = blocks_of(ROOT / "README.md")[0]
    assert [c.line.split("#")[0].strip() for c in commands_of(first)] == ["make demo",
                                                                          "make test"]
    assert ". .venv/bin/activate" in head and ".venv/bin/tunelab" in head
    # what the README promises is there: the script beside this interpreter, where tunelab is
    # installed in its venv (not where it comes by PYTHONPATH, as on the GPU machine)
    prefix = Path(sys.prefix).resolve()
    installed_here = any(Path(str(d.locate_file(""))).resolve().is_relative_to(prefix)
                         for d in metadata.distributions(name="tunelab"))
    if installed_here and (Path(PY).parent / "activate").is_file():
        assert (Path(PY).parent / "tunelab").is_file()
    make = (ROOT / "Makefile").read_text()
    demo = make[make.index("\ndemo:"):].split("\n\n")[0]
    assert "$(VENV)/activate" in demo, "make demo ends by saying how to get tunelab on the PATH"


# --- running the blocks ------------------------------------------------------------------------


def _quiet_env(scratch: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"  # ranks that wait give their core away
    if scratch is not None:
        env["XDG_CACHE_HOME"] = str(scratch / ".cache")
        env["TUNELAB_CACHE"] = str(scratch / ".cache" / "tunelab")
        env["PATH"] = f"{scratch / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _shim(directory: Path, name: str, argv: list[str]) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\nexec {' '.join(shlex.quote(a) for a in argv)} \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _scratch(base: Path, demo: Path | None) -> Path:
    """A directory like a checkout after ``make demo``: examples, benchmarks, scripts,
    runs/demo (when given) and ``.venv/bin/{tunelab,python,python3}``."""
    for name in LINKED:
        (base / name).symlink_to(ROOT / name)
    shims = base / ".venv" / "bin"
    shims.mkdir(parents=True)
    for name in ("python", "python3"):
        _shim(shims, name, [PY])
    _shim(shims, "tunelab", [PY, "-m", "tunelab"])
    (shims / "activate").write_text(f"export PATH={shlex.quote(str(shims))}:$PATH\n")
    if demo is not None:
        shutil.copytree(demo, base / "runs" / "demo")
    return base


def _runnable(doc: Path) -> list[Block]:
    return [b for b in blocks_of(doc) if b.marker == "file" or (b.is_command and not b.marker)]


RUNNABLE = [doc for doc in documents() if any(b.is_command for b in _runnable(doc))]


@pytest.fixture(scope="session")
def demo_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``runs/demo`` as ``make demo`` leaves it (real pw.x; two repeats instead of three)."""
    if shutil.which("pw.x") is None or shutil.which("mpirun") is None:
        pytest.skip("pw.x (quantum-espresso) and mpirun (openmpi-bin) are needed")
    base = tmp_path_factory.mktemp("demo")
    res = subprocess.run([PY, "-m", "tunelab", "run", str(ROOT / "examples" / "qe-si.yaml"),
                          "--dir", str(base / "demo"), "--repeats", "2", "-q"],
                         capture_output=True, text=True, timeout=900, env=_quiet_env(base))
    assert res.returncode == 0, res.stderr
    return base / "demo"


def _normal(text: str) -> str:
    return " ".join(text.split())


def _run(command: Command, block: Block, scratch: Path) -> None:
    env = _quiet_env(scratch)
    if command.needs_shell:
        runs = [["bash", "-c", f"set -o pipefail; {command.line}"]]
    else:
        runs = command.argvs()
    out = ""
    for argv in runs:
        if argv[0] in TUNELABS[1:] + PYTHONS[2:]:
            argv = [str(scratch / argv[0]), *argv[1:]]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=scratch,
                             env=env, stdin=subprocess.DEVNULL)
        shown = f"{block.where}: {command.line}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        assert res.returncode == 0, shown
        assert "Traceback" not in res.stdout + res.stderr, shown
        out += res.stdout + "\n" + res.stderr
    printed = {_normal(line) for line in out.splitlines()}
    missing = [line for line in command.output
               if line.strip() and "…" not in line and _normal(line) not in printed]
    assert missing == [], f"{block.where}: {command.line} did not print:\n" + \
        "\n".join(missing) + f"\n--- it printed:\n{out[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("doc", RUNNABLE, ids=_id)
def test_command_blocks_run_as_written(doc: Path, tmp_path: Path,
                                       request: pytest.FixtureRequest) -> None:
    blocks = _runnable(doc)
    text = "\n".join("\n".join(b.lines) for b in blocks)
    demo = request.getfixturevalue("demo_study") if "runs/demo" in text else None
    scratch = _scratch(tmp_path, demo)
    for block in blocks:
        if block.marker == "file":
            (scratch / block.argument).write_text("\n".join(block.lines) + "\n")
            continue
        for command in commands_of(block):
            _run(command, block, scratch)


def test_no_file_keeps_a_merge_conflict_marker() -> None:
    """A merge resolved in a hurry can leave ``<<<<<<<`` / ``>>>>>>>`` lines behind: in a
    module they fail at import, in a document nothing else notices them."""
    markers = re.compile(r"^(<<<<<<< |>>>>>>> )", re.M)
    left = [str(path.relative_to(ROOT))
            for part in ("README.md", "docs", "src", "tests", "benchmarks", "examples", "scripts")
            for path in ([ROOT / part] if (ROOT / part).is_file() else (ROOT / part).rglob("*"))
            if path.is_file() and path.suffix in {".md", ".py", ".yaml", ".yml", ".sh", ".toml"}
            and markers.search(path.read_text(errors="replace"))]
    assert left == []
