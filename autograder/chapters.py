"""Where each chapter's instructor notebook, reference and hidden tests live."""
from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

from .env import ROOT

SOURCE_DIR = ROOT / "source"
CHAPTER_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")


@dataclasses.dataclass(frozen=True)
class ChapterInfo:
    name: str

    @property
    def instructor_notebook(self) -> Path:
        return SOURCE_DIR / self.name / f"{self.name}.ipynb"

    @property
    def module(self) -> str:
        return "ch" + self.name

    def reference(self):
        return importlib.import_module(f"solutions.{self.module}")

    def hidden(self):
        """The chapter's ``HiddenTests``."""
        return importlib.import_module(f"solutions.{self.module}_hidden").hidden


def known() -> dict[str, ChapterInfo]:
    return {d.name: ChapterInfo(d.name) for d in sorted(SOURCE_DIR.glob("[0-9][0-9]_*"))
            if (d / f"{d.name}.ipynb").exists()}
