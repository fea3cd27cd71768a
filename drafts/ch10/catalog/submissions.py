"""Chapter 10's catalog as answer cells: correct styles, mistakes, cheats (drafts; tests/test_grading_ch10.py wires them).

A mistake is one named change of a correct style's cell (``changed``: each ``old`` must be there,
exactly once). ``cases()`` gives each submission with the exercises a plain-PyTorch check
(check.py) must find wrong; a cheat computes the right values outside the kernels, so only the
grader's kernel-only rule can find it.
"""
from __future__ import annotations

import os
import sys

# The cells themselves live in the catalog's test module (one copy): drafts read them from there.
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")]
from test_grading_ch10 import CHEATS, EDITS as MISTAKES, STYLES  # noqa: E402

EXERCISES = list(STYLES["offsets"])
BASE = STYLES["offsets"]


def changed(cell: str, *edits: tuple[str, str]) -> str:
    """``cell`` with each (old, new) replaced; every ``old`` occurs exactly once (a named change)."""
    for old, new in edits:
        if cell.count(old) != 1:
            raise ValueError(f"{old!r} occurs {cell.count(old)} times in the cell it should change")
        cell = cell.replace(old, new)
    return cell


# Mistakes that read wild memory (a table index past its row, so a block number nobody wrote): the
# process dies (SIGSEGV, measured), so the grader meets them as a dead kernel (kernel_only).
CRASHES = {"paged_div_mod_swapped"}
CHECKS_ALL = EXERCISES

SHOWS_IN = {"flash_attention_forward": {"flash_attention"}, "flash_attention_backward": {"flash_attention"}}

def mistake_answers(name: str) -> dict:
    style, exercise, edits = MISTAKES[name]
    return {**BASE, exercise: changed(STYLES[style][exercise], *edits)}


def cases() -> dict:
    """name -> (kind, {exercise: answer cell}, exercises a plain-PyTorch check must find wrong)."""
    out = {name: ("correct", dict(answers), set()) for name, answers in STYLES.items()}
    memory = {"forward_scores_buffer", "function_saves_probabilities"}
    for name, (_, exercise, _) in MISTAKES.items():
        wrong = set() if name in memory else {exercise} | SHOWS_IN.get(exercise, set())
        out[name] = ("memory" if name in memory else "mistake", mistake_answers(name), wrong)
    for name in CRASHES:
        out[name] = ("crash", out[name][1], set(CHECKS_ALL))
    for name, (exercise, cell) in CHEATS.items():
        out[name] = ("cheat", {**BASE, exercise: cell}, set())
    return out
