"""Triton is Chapter 10's dependency alone: chapters 1 to 9 never import it.

Their learner notebooks (both editions) and their generated reference and hidden-test modules
must run where the triton package does not install (macOS, Windows: it has no wheel there) and
must not pay for importing it (about two seconds) in every grading. Read from the notebooks'
code and the modules' source (every import, function-local ones too), and checked by importing
the modules in a fresh process: an import reached through the grader's authoring API counts too.
"""
from __future__ import annotations

import ast
import subprocess
import sys

import nbformat

from support import ROOT

from coursekit.conventions import chapter_names

BEFORE_TRITON = [name for name in chapter_names() if int(name[:2]) < 10]


def _imported(source: str) -> set[str]:
    """Top-level package names a piece of Python source imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _reference_modules() -> list[str]:
    return [f"solutions.ch{name}{suffix}" for name in BEFORE_TRITON for suffix in ("", "_hidden")]


def test_there_are_chapters_before_triton():
    assert len(BEFORE_TRITON) == 9, BEFORE_TRITON


def test_learner_notebooks_of_chapters_1_to_9_do_not_import_triton():
    for name in BEFORE_TRITON:
        for notebook in (ROOT / "chapters" / f"{name}.ipynb", ROOT / "chapters" / "zh_CN" / f"{name}.ipynb"):
            cells = nbformat.read(notebook, as_version=4).cells
            imported = set().union(*(_imported(c.source) for c in cells if c.cell_type == "code"))
            assert "triton" not in imported, f"{notebook.relative_to(ROOT)} imports triton"


def test_reference_and_hidden_modules_of_chapters_1_to_9_do_not_import_triton():
    for module in _reference_modules():
        path = ROOT / (module.replace(".", "/") + ".py")
        assert "triton" not in _imported(path.read_text()), f"{path.relative_to(ROOT)} imports triton"
    # torch's own modules named torch._library.triton etc. are not the triton package
    code = ("import importlib, sys\n"
            f"for module in {_reference_modules()!r}:\n"
            "    importlib.import_module(module)\n"
            "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", f"importing chapters 1-9's modules imported {proc.stdout.strip()}"
