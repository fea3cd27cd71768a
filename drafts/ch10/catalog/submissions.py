"""Chapter 10's catalog as answer cells: correct styles, mistakes, cheats (drafts; tests/test_grading_ch10.py wires them)."""
from __future__ import annotations

import offsets_style

EXERCISES = list(offsets_style.ANSWERS)
BASE = offsets_style.ANSWERS


def cases() -> dict:
    """name -> (kind, {exercise: answer cell}, exercises a plain-PyTorch check must find wrong)."""
    out = {"offsets": ("correct", dict(BASE), set())}
    return out
