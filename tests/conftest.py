"""Shared fixtures: submissions (from ``coursekit.sample_submissions``), graded in parallel, in two tiers.

* ``judge_catalog``: in process (``autograder.inprocess.grade_notebook``: the kernel's own call
  routine and the grader's own judge, no nbgrader, no sandbox), each notebook in a process forked from
  a worker that has prepared its chapter (probes and reference results built once).
* ``grade_catalog``: the real pipeline (nbgrader autograde in the sandboxed kernel).

Tests that use the real pipeline are marked ``pipeline`` (by their fixtures, or by a module's
``pytestmark``); ``make check`` runs everything else, ``make test`` everything.
"""
from __future__ import annotations

import os

import pytest

# A cell's time limit in the tests (the grader defaults to 60 s): every looping case pays it once per
# cell that calls the looping code. Above a call's waiting limit (3 x 4 s, below), so that a looping
# call is named as one; every correct style of the eight catalogs gets full marks in process at 4 s.
os.environ.setdefault("ATTN_GRADER_CELL_TIMEOUT", "15")
# A call's limit in processor seconds (the grader defaults to 10 s): every looping case pays it
# once per test of its exercise, and its waiting limit (three times this) stays under the cell's.
# The slowest call of every correct style of the eight catalogs uses 1.2 s (flash and linear
# attention at N = 8192), alone or beside other work: processor time does not grow with load.
os.environ.setdefault("ATTN_GRADER_CALL_TIMEOUT", "4")

from run_once import once, run_folder  # noqa: E402
from support import grade_notebooks, judge_notebooks, shut_grading_pool  # noqa: E402


def pytest_sessionfinish(session):
    shut_grading_pool()


def _cached(tmp_path_factory, grade):
    cache: dict[str, dict] = {}

    def run(notebooks):
        # Catalogs of different chapters reuse names ("correct:reference"): key by chapter too.
        keyed = {f"{nb.metadata['course']['chapter']}/{name}": nb for name, nb in notebooks.items()}
        todo = {k: v for k, v in keyed.items() if k not in cache}
        if todo:
            graded = grade({k.replace("/", "__").replace(":", "_"): v for k, v in todo.items()},
                           tmp_path_factory.mktemp("catalog"))
            cache.update(zip(todo, graded.values()))
        return {name: cache[key] for name, key in zip(notebooks, keyed)}
    return run


@pytest.fixture(scope="session")
def grade_catalog(tmp_path_factory):
    """The real pipeline (nbgrader + sandbox), once per notebook per session."""
    return _cached(tmp_path_factory, grade_notebooks)


@pytest.fixture(scope="session")
def judge_catalog(tmp_path_factory):
    """In process (same call routine, same judge), once per notebook per session."""
    return _cached(tmp_path_factory, judge_notebooks)


def pytest_generate_tests(metafunc):
    """A chapter's catalog (tests/catalog.py) is parametrized by the cases its module declares."""
    catalog = getattr(metafunc.module, "CATALOG", None)
    for kind in ("correct", "mistake", "kernel", "tamper", "sample", "disguised"):
        if f"{kind}_case" in metafunc.fixturenames:
            metafunc.parametrize(f"{kind}_case", catalog.names(kind) if catalog else [])


@pytest.fixture(scope="session")
def readme_clone(tmp_path_factory):
    """A fresh clone run through the README's commands (``class_runs.readme_clone``); its
    ``my-class`` is the sample class graded. Read it, or copy what a test changes."""
    import class_runs
    return once(run_folder(tmp_path_factory), "readme", class_runs.readme_clone)


@pytest.fixture(scope="session")
def released_class(tmp_path_factory):
    """The sample class released and collected, not graded (``class_runs.released_class``): copy
    it with ``class_runs.new_course``."""
    import class_runs
    return once(run_folder(tmp_path_factory), "released", class_runs.released_class)


@pytest.fixture(scope="session")
def sharded_class(tmp_path_factory, released_class):
    """Five students of the sample class graded in two shards and merged (``class_runs.sharded_class``):
    (tmp, course, shard folders, merge's output). Read it, or copy what a test changes."""
    import class_runs
    return once(run_folder(tmp_path_factory), "sharded",
                lambda tmp: (tmp, *class_runs.sharded_class(tmp, released_class)))


PIPELINE_FIXTURES = {"grade_catalog", "readme_clone", "sharded_class", "book"}
# Modules whose tests run the grader's command line, a class run or the book build (each
# through nbgrader and the sandboxed kernel, or Sphinx): the full tier only.
PIPELINE_MODULES = {"test_sandbox", "test_cli", "test_classroom", "test_class_report", "test_readme",
                    "test_nbgrader_e2e", "test_book", "test_chinese_edition", "test_accessibility", "test_publish"}


# Seconds each slow module took in a two-worker `make test` on a fresh clone after `make book`
# (timed per module, rounded; a module not listed takes under 20 s; the chapter catalogs and
# test_chinese_edition estimated from their fewer pipeline gradings until re-timed). Add a new slow
# module here with its time.
MODULE_SECONDS = {
    "test_classroom": 405, "test_accessibility": 270, "test_sandbox": 255, "test_grading_ch05": 145,
    "test_grading_ch06": 135, "test_cli": 105, "test_grading_ch02": 95, "test_escape_pages": 90, "test_publish": 85,
    "test_grading_ch08": 75, "test_chinese_edition": 75, "test_grading_ch07": 70, "test_grading_ch01": 60,
    "test_grading_ch03": 50, "test_grading_ch04": 50, "test_book": 40, "test_nbgrader_e2e": 30,
    "test_generated": 25, "test_learner_notebook": 25, "test_instructor_workflow": 160, "test_class_end_to_end": 330, "test_escape_records": 100, "test_escape_reference": 90,
    "test_instructor_policies": 70, "test_exchange_bombs": 50, "test_collect_names": 40, "test_escape_syscalls": 30,
}
# The module that builds the book (``test_book.book``) for the others that read it.
BOOK_BUILDER = "test_accessibility"


def pytest_collection_modifyitems(config, items):
    """A test that grades through the real pipeline (its fixtures or its module say so) is marked
    ``pipeline``; modules are put in the order ``_module_order`` gives."""
    for item in items:
        module = getattr(item, "module", None)
        if PIPELINE_FIXTURES & set(getattr(item, "fixturenames", ())) or \
                (module is not None and module.__name__.rpartition(".")[2] in PIPELINE_MODULES):
            item.add_marker(pytest.mark.pipeline)
    order = _module_order(items)
    items.sort(key=lambda item: order[item.path.stem])  # stable: a module's own order stays


def _module_order(items) -> dict[str, tuple]:
    """The order in which ``make test``'s two workers take whole modules (pytest-xdist ``--dist
    loadfile --no-loadscope-reorder`` keeps it): the book's builder first, so that the book is
    built (on a fresh clone, every chapter executed: many minutes) while the other worker grades;
    then the modules that do not read the book, the longest first, so that neither worker is left
    with a long one at the end; then the book's other readers, the longest first."""
    reads_book = {item.path.stem for item in items if "book" in getattr(item, "fixturenames", ())}
    return {item.path.stem: (0 if item.path.stem == BOOK_BUILDER else 2 if item.path.stem in reads_book else 1,
                             -MODULE_SECONDS.get(item.path.stem, 0)) for item in items}
