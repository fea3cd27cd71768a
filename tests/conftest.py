"""Shared fixtures: submissions (from ``coursekit.sample_submissions``), graded in parallel."""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("ATTN_GRADER_CELL_TIMEOUT", "20")

from coursekit.sample_submissions import learner_notebook, reference_answers, submission  # noqa: E402,F401


_upcoming = None  # per worker process: the next notebook's kernel, booting while one is graded


def _grade_one(path: str):
    global _upcoming
    import warnings
    warnings.filterwarnings("ignore")
    from autograder.grading import KernelSlot, grade
    try:
        current, _upcoming = _upcoming or KernelSlot(), None
        _upcoming = KernelSlot()
        return grade(Path(path), slot=current).as_json()
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {err}"}


def grade_notebooks(notebooks: dict[str, nbformat.NotebookNode], tmp: Path) -> dict[str, dict]:
    """Grade many submissions, two worker processes (one per core)."""
    paths = {}
    for name, nb in notebooks.items():
        folder = tmp / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{nb.metadata['course']['chapter']}.ipynb"
        nbformat.write(nb, path)
        paths[name] = str(path)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        results = dict(zip(paths, pool.map(_grade_one, paths.values())))
    return results


def scores_by_test(result: dict) -> dict[str, str]:
    """test id -> its feedback lines joined, for assertions."""
    out: dict[str, list[str]] = {}
    for exercise in result["exercises"].values():
        for line in exercise["feedback"]:
            out.setdefault(line.split(" ", 1)[0], []).append(line)
    return {test_id: " | ".join(lines) for test_id, lines in out.items()}


@pytest.fixture(scope="session")
def grade_catalog(tmp_path_factory):
    cache: dict[str, dict] = {}

    def run(notebooks):
        # Catalogs of different chapters reuse names ("correct:reference"): key by chapter too.
        keyed = {f"{nb.metadata['course']['chapter']}/{name}": nb for name, nb in notebooks.items()}
        todo = {k: v for k, v in keyed.items() if k not in cache}
        if todo:
            graded = grade_notebooks({k.replace("/", "__").replace(":", "_"): v for k, v in todo.items()},
                                     tmp_path_factory.mktemp("catalog"))
            cache.update(zip(todo, graded.values()))
        return {name: cache[key] for name, key in zip(notebooks, keyed)}
    return run


def pytest_generate_tests(metafunc):
    """A chapter's catalog (tests/catalog.py) is parametrized by the cases its module declares."""
    catalog = getattr(metafunc.module, "CATALOG", None)
    for kind in ("correct", "mistake", "tamper"):
        if f"{kind}_case" in metafunc.fixturenames:
            metafunc.parametrize(f"{kind}_case", catalog.names(kind) if catalog else [])
