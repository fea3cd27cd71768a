"""Every setting of the grader in one place: its default, its environment variable, its meaning.

``GraderSettings.from_environment()`` reads them; a grading reads them once (``grading.grade``,
``inprocess.grade_notebook`` install theirs with ``in_use``) and every reader asks ``current()``,
so nothing else reads ``os.environ`` for ``ATTN_GRADER_*`` (``tests/test_settings.py`` checks).
The sandbox's limits (``Limits``, re-exported by ``sandbox``) are read here too.

Not settings: ``ATTN_GRADER_CASES``, ``ATTN_GRADER_RESULTS`` and ``ATTN_GRADER_RULES`` are the
channel ``kernel`` opens into the sandboxed kernel (the exchange folders, the audit hook's rules),
read there by the plain files of ``sandboxed/``, where nothing of the project exists; tests set
the first two to run ``attn_probe.run`` in their own process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Iterator

from coursekit.conventions import ROOT

GiB, MiB = 2**30, 2**20


@dataclasses.dataclass(frozen=True)
class Limits:
    memory: int = 4 * GiB  # resident memory of the whole sandbox
    tasks: int = 256  # processes and threads of the whole sandbox
    cpu_seconds: int = 1800
    file_size: int = 512 * MiB  # one written file
    open_files: int = 1024
    scratch: int = 1 * GiB  # the private /tmp
    shm: int = 256 * MiB  # the private /dev/shm
    exchange: int = 512 * MiB  # the folder shared with the grader
    exchange_entries: int = 10_000  # files and folders in it
    wall_seconds: float = 1800.0

    @classmethod
    def from_environment(cls) -> "Limits":
        """Defaults, changed by ATTN_GRADER_LIMIT_<NAME> (bytes, seconds or a count)."""
        values = {}
        for field in dataclasses.fields(cls):
            raw = os.environ.get(f"ATTN_GRADER_LIMIT_{field.name.upper()}")
            if raw:
                values[field.name] = float(raw) if field.type == "float" else int(float(raw))
        return cls(**values)


def _setting(default, name: str, meaning: str):
    """A field of GraderSettings: NAME is its environment variable, or where else it is set; MEANING
    is its line of the README's table of settings (``tests/test_settings.py`` compares them)."""
    return dataclasses.field(default=default, metadata={"name": name, "meaning": meaning})


ENV = "ATTN_GRADER_"  # the prefix of every variable read here


@dataclasses.dataclass(frozen=True)
class GraderSettings:
    cell_timeout: float = _setting(60.0, ENV + "CELL_TIMEOUT",
                                   "seconds one notebook cell may run before it is interrupted")
    call_timeout: float = _setting(10.0, ENV + "CALL_TIMEOUT",
                                   "processor seconds one call of submitted code may use: over it, its test fails")
    private_seed: str = _setting("", ENV + "PRIVATE_SEED",
                                 "a secret of the course that gives every hidden test other random inputs")
    cache: Path = _setting(ROOT / ".cache" / "grader", ENV + "CACHE",
                           "the folder of the scratch nbgrader courses, built once per chapter")
    keep: bool = _setting(False, ENV + "KEEP",
                          "debugging aid: keep each grading's scratch folder instead of removing it")
    no_cgroups: bool = _setting(False, ENV + "NO_CGROUPS",
                                "test and benchmark knob: no control group, the watchdog alone enforces "
                                "memory and tasks")
    output_cap: int = _setting(64 * 1024, "GuardedExecute.output_cap",
                               "characters of output kept per cell (an nbgrader config value of the "
                               "execute step, not an environment variable)")
    limits: Limits = _setting(None, ENV + "LIMIT_<NAME>",
                              "the sandbox's limits, each in bytes, seconds or a count "
                              "(their table is in \"The sandbox\" below)")

    def __post_init__(self):
        if self.limits is None:
            object.__setattr__(self, "limits", Limits())

    @classmethod
    def from_environment(cls) -> "GraderSettings":
        """The defaults, each changed by its variable where that is set (a flag: set and not empty)."""
        values: dict = {"limits": Limits.from_environment()}
        for field in dataclasses.fields(cls):
            name = field.metadata["name"]
            raw = os.environ.get(name, "") if name.startswith(ENV) and field.name != "limits" else ""
            if raw:
                kind = type(field.default)
                values[field.name] = True if kind is bool else Path(raw) if isinstance(field.default, Path) \
                    else kind(raw)
        return cls(**values)


_in_use: list[GraderSettings] = []  # the gradings in progress in this process, innermost last


@contextlib.contextmanager
def in_use(settings: GraderSettings) -> Iterator[GraderSettings]:
    """Within: ``current()`` is SETTINGS (one grading reads the environment once)."""
    _in_use.append(settings)
    try:
        yield settings
    finally:
        _in_use.pop()


def current() -> GraderSettings:
    """The settings of the grading in progress, else those the environment gives now."""
    return _in_use[-1] if _in_use else GraderSettings.from_environment()
