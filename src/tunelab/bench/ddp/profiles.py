"""Accelerator profiles: how long one accelerator's training step takes, with a source.

``--compute emulate:MODEL/ACCELERATOR/bBATCH[/PRECISION]`` (e.g. ``resnet50/a100/b400``)
looks the step time up in two tables: the one shipped with tunelab (``profiles.yaml`` beside
this module: MLPerf Storage's figures and how each was obtained) and the user's own
(``$TUNELAB_ACCELERATORS``, else ``~/.config/tunelab/accelerators.yaml``), which ``tunelab
bench ddp calibrate`` writes after timing real steps on the device at hand. A user entry
with the same key replaces the shipped one. An unknown name lists the known ones.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tunelab.errors import WorkloadError
from tunelab.inputfile import read_input_text
from tunelab.safeyaml import load_yaml

__all__ = ["KINDS", "Profile", "find_profile", "load_profiles", "parse_profile_name",
           "read_section", "shipped_table", "user_profile_path", "write_profile"]

KINDS = ("measured", "derived")
MAX_FILE_BYTES = 1 << 20
MAX_ENTRIES = 10_000
_NAME = re.compile(r"^([a-z0-9_.-]+)/([a-z0-9_.-]+)/b(\d+)(?:/([a-z0-9_.-]+))?$")


@dataclass(frozen=True)
class Profile:
    """One accelerator's step time for a model at a batch per accelerator."""

    model: str
    accelerator: str
    precision: str
    batch: int
    step_s: float
    kind: str
    source: str
    note: str = ""
    #: how the step was run where measured: ``channels_last`` or ``contiguous`` (calibrate)
    memory_format: str = ""

    @property
    def name(self) -> str:
        """``model/accelerator/bBATCH/precision``."""
        return f"{self.model}/{self.accelerator}/b{self.batch}/{self.precision}"

    @property
    def key(self) -> tuple[str, str, int, str]:
        """What makes two entries the same profile."""
        return (self.model, self.accelerator, self.batch, self.precision)


def user_profile_path() -> Path:
    """The user's own table: ``$TUNELAB_ACCELERATORS`` or ``~/.config/tunelab/…``."""
    env = os.environ.get("TUNELAB_ACCELERATORS")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tunelab" / "accelerators.yaml"


def _entry(raw: Any, where: str) -> Profile:
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: a profile must be a mapping, got {type(raw).__name__}")
    missing = [k for k in ("model", "accelerator", "precision", "batch", "step_s", "kind",
                           "source") if k not in raw]
    if missing:
        raise WorkloadError(f"{where}: profile {raw.get('model')}/{raw.get('accelerator')} "
                            f"lacks {', '.join(missing)}")
    try:
        p = Profile(model=str(raw["model"]).lower(), accelerator=str(raw["accelerator"]).lower(),
                    precision=str(raw["precision"]).lower(), batch=int(raw["batch"]),
                    step_s=float(raw["step_s"]), kind=str(raw["kind"]),
                    source=str(raw["source"]), note=str(raw.get("note", "")),
                    memory_format=str(raw.get("memory_format", "")))
    except (TypeError, ValueError) as exc:
        raise WorkloadError(f"{where}: bad number in profile {raw} ({exc})") from None
    if p.kind not in KINDS:
        raise WorkloadError(f"{where}: profile {p.name}: kind must be measured or derived, "
                            f"got {p.kind!r}")
    if not (math.isfinite(p.step_s) and 0 < p.step_s <= 3600) or not 1 <= p.batch <= 1 << 16:
        raise WorkloadError(f"{where}: profile {p.name}: step_s must lie in (0, 3600] and "
                            f"batch in 1..65536")
    return p


def read_section(path: Path, key: str) -> list[Any]:
    """The list under ``key`` of a profile table (``profiles``, ``fabrics``); empty when the
    file does not exist; one-line errors for an unreadable, oversized or malformed file."""
    if not os.path.lexists(path):
        return []
    text = read_input_text(path, f"accelerator profiles {path}", limit=MAX_FILE_BYTES,
                           error=WorkloadError)
    doc = load_yaml(text, str(path))[0] or {}
    raw = doc.get(key, []) if isinstance(doc, dict) else None
    if not isinstance(raw, list):
        raise WorkloadError(f"accelerator profiles {path}: expected a list under '{key}'")
    if len(raw) > MAX_ENTRIES:
        raise WorkloadError(f"accelerator profiles {path}: more than {MAX_ENTRIES} entries")
    return raw


def shipped_table() -> Path:
    """The table shipped with tunelab (``profiles.yaml`` beside this module)."""
    return Path(__file__).with_name("profiles.yaml")


def _read_table(path: Path) -> list[Profile]:
    return [_entry(r, str(path)) for r in read_section(path, "profiles")]


def load_profiles(user: Path | None = None) -> list[Profile]:
    """The shipped table, then the user's (same key: the user's entry wins)."""
    table: dict[tuple[str, str, int, str], Profile] = {}
    for p in _read_table(shipped_table()):
        table[p.key] = p
    for p in _read_table(user or user_profile_path()):
        table[p.key] = p
    return list(table.values())


def parse_profile_name(text: str) -> tuple[str, str, int, str | None]:
    """``resnet50/a100/b400`` or ``resnet50/a100/b400/mixed`` -> its parts."""
    m = _NAME.match(text.strip().lower())
    if not m:
        raise WorkloadError(f"--compute emulate:{text}: expected MODEL/ACCELERATOR/bBATCH"
                            "[/PRECISION], e.g. emulate:resnet50/a100/b400")
    return m.group(1), m.group(2), int(m.group(3)), m.group(4)


def find_profile(text: str, profiles: list[Profile] | None = None) -> Profile:
    """The profile ``text`` names; an unknown or ambiguous name lists the known ones."""
    model, accel, batch, precision = parse_profile_name(text)
    table = profiles if profiles is not None else load_profiles()
    hits = [p for p in table if (p.model, p.accelerator, p.batch) == (model, accel, batch)
            and (precision is None or p.precision == precision)]
    if len(hits) == 1:
        return hits[0]
    known = ", ".join(sorted(p.name for p in table)) or "none"
    if not hits:
        raise WorkloadError(f"--compute emulate:{text}: unknown accelerator profile; known: "
                            f"{known} (tunelab bench ddp calibrate adds the device at hand)")
    raise WorkloadError(f"--compute emulate:{text}: several precisions match "
                        f"({', '.join(sorted(p.precision for p in hits))}); add one, e.g. "
                        f"emulate:{hits[0].name}")


def write_profile(profile: Profile, path: Path | None = None) -> Path:
    """Add ``profile`` to the user's table (replacing an entry with the same key)."""
    import yaml

    path = path or user_profile_path()
    entries = [p for p in _read_table(path) if p.key != profile.key] + [profile]
    doc: dict[str, Any] = {"profiles": [{k: v for k, v in asdict(p).items() if v != ""}
                                        for p in entries]}
    fabrics = read_section(path, "fabrics")
    if fabrics:  # the user's own fabrics stay
        doc["fabrics"] = fabrics
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("# accelerator profiles written by tunelab bench ddp calibrate\n"
                       + yaml.safe_dump(doc, sort_keys=False, width=1000))
        os.replace(tmp, path)
    except OSError as exc:
        raise WorkloadError(f"cannot write accelerator profiles {path}: "
                            f"{exc.strerror or exc}") from None
    return path
