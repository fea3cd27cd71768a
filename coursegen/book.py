"""``python -m coursegen.book``: build the Jupyter Book into ``_build/html``.

Each learner notebook is executed once with the reference solution standing in for
its stubs (cached by content hash); its outputs are then copied onto the learner
notebook, so the book shows figures made by the reference while every exercise cell
shows only its stub. The page's download button serves the plain learner notebook.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from coursekit.conventions import is_test_cell, with_python_bin_on_path

from . import ROOT, chapters, strip_solution_markers

BUILD = ROOT / "_build"
STAGE = BUILD / "src"
EXEC_CACHE = BUILD / "executed"
BOOK_FILES = ("_config.yml", "_toc.yml", "intro.md", "instructors.md", "README.md")  # README: included
LEAK = re.compile(r"BEGIN (SOLUTION|HIDDEN TESTS)|END (SOLUTION|HIDDEN TESTS)|attn_probe|"
                  r"^\s*(from|import) solutions\b", re.M)


def executed_chapter(chapter) -> nbformat.NotebookNode:
    learner_path = ROOT / "chapters" / f"{chapter.name}.ipynb"
    learner = nbformat.read(learner_path, as_version=4)
    solutions = {c.name: strip_solution_markers(c.source) for c in chapter.of_kind("exercise")}
    key = hashlib.sha256(learner_path.read_bytes() + repr(sorted(solutions.items())).encode()).hexdigest()[:16]
    cached = EXEC_CACHE / f"{chapter.name}-{key}.ipynb"
    if cached.exists():
        return nbformat.read(cached, as_version=4)
    run = nbformat.from_dict(learner)
    for cell in run.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in solutions:
            cell.source = solutions[grade_id]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"exec-{chapter.name}-") as cwd:  # files a chapter writes
        NotebookClient(run, timeout=600, kernel_name="python3", resources={"metadata": {"path": cwd}},
                       allow_errors=False).execute()
    print(f"executed {chapter.name} with the reference in {time.perf_counter() - started:.1f} s")
    for cell, done in zip(learner.cells, run.cells):
        if cell.cell_type == "code":
            cell.outputs = [] if cell.metadata.get("nbgrader", {}).get("solution") else done.outputs
            cell.execution_count = None
    EXEC_CACHE.mkdir(parents=True, exist_ok=True)
    for old in EXEC_CACHE.glob(f"{chapter.name}-*.ipynb"):
        old.unlink()
    nbformat.write(learner, cached)
    return learner


def with_tests_collapsed(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """On the page, visible tests sit behind a toggle so the prose leads; the notebook keeps them open."""
    for cell in nb.cells:
        if cell.cell_type == "code" and is_test_cell(cell):
            tags = cell.metadata.setdefault("tags", [])
            if "hide-input" not in tags:
                tags.append("hide-input")
    return nb


def stage(found) -> None:
    shutil.rmtree(STAGE, ignore_errors=True)
    (STAGE / "chapters").mkdir(parents=True)
    for name in BOOK_FILES:
        shutil.copyfile(ROOT / name, STAGE / name)
    for chapter in found:
        nbformat.write(with_tests_collapsed(executed_chapter(chapter)), STAGE / "chapters" / f"{chapter.name}.ipynb")


def build() -> None:
    env = with_python_bin_on_path()
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(STAGE),
           "--path-output", str(ROOT), "--warningiserror", "--keep-going", "--quiet"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"jupyter-book build failed (exit {proc.returncode})")


def publish_learner_notebooks(found) -> None:
    """The download button serves _sources/...: make that the learner notebook itself."""
    for chapter in found:
        target = BUILD / "html" / "_sources" / "chapters" / f"{chapter.name}.ipynb"
        if target.exists():
            shutil.copyfile(ROOT / "chapters" / f"{chapter.name}.ipynb", target)


def leaks(html_dir: Path) -> list[str]:
    found = []
    for path in html_dir.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".ipynb", ".txt", ".md", ".py", ".js", ".json"):
            if "_static" in path.parts and path.suffix == ".js":
                continue
            if LEAK.search(path.read_text(errors="replace")):
                found.append(str(path.relative_to(html_dir)))
    return found


def main() -> int:
    os.chdir(ROOT)
    found = chapters()
    started = time.perf_counter()
    stage(found)
    build()
    publish_learner_notebooks(found)
    bad = leaks(BUILD / "html")
    if bad:
        print("the built book holds solution or hidden-test text: " + ", ".join(bad), file=sys.stderr)
        return 1
    print(f"book built in {time.perf_counter() - started:.1f} s: {BUILD / 'html' / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
