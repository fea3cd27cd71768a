"""Shared fixtures: submissions (from ``coursekit.sample_submissions``), graded in parallel, in two tiers.

* ``judge_catalog``: in process (``autograder.inprocess.grade_notebook``: the kernel's own call
  routine and the grader's own judge, no nbgrader, no sandbox), each notebook in a process forked from
  a worker that has prepared its chapter (probes and reference results built once).
* ``grade_catalog``: the real pipeline (nbgrader autograde in the sandboxed kernel).

Tests that use the real pipeline are marked ``pipeline`` (by their fixtures, or by a module's
``pytestmark``); ``make check`` runs everything else, ``make test`` everything.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

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

# Triton reads TRITON_INTERPRET once, when it is first imported: whichever test module imports it first
# (a chapter's solutions, the mutation benchmark, the kernel-only checks) must find it set, or the
# kernels it compiles later call triton.language's own functions outside the interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")

from run_once import once, run_folder  # noqa: E402
from support import DEFAULT_MODULE_SECONDS, ROOT, grade_notebooks, judge_notebooks, shut_grading_pool  # noqa: E402


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
# Modules whose tests all run the grader's command line, a class run or the book build say so
# themselves (``pytestmark = pytest.mark.pipeline``); a test that uses these fixtures is marked here.

# Seconds each module took in the last run that ran it whole (recorded by ``pytest_runtest_logreport``
# below, per marker expression: ``make check`` and ``make test`` each keep their own), else in the
# committed default (a two-worker ``make test`` on a fresh clone after ``make book``; a module not
# listed takes under 20 s). The record is never committed.
RECORDED_SECONDS = ROOT / ".cache" / "test_module_seconds.json"
# The module that builds the book (``test_book.book``) for the others that read it.
BOOK_BUILDER = "test_accessibility"


def module_seconds(markexpr: str) -> dict[str, float]:
    """Module name -> its seconds: the last recorded run with this marker expression over the default."""
    seconds = json.loads(DEFAULT_MODULE_SECONDS.read_text())
    if RECORDED_SECONDS.exists():
        seconds.update(json.loads(RECORDED_SECONDS.read_text()).get(markexpr, {}))
    return seconds


def _records(config) -> bool:
    """Only the controller (not an xdist worker) of a run of whole modules records their times."""
    return not hasattr(config, "workerinput") and not config.option.keyword and \
        not any("::" in str(arg) for arg in config.args)


_ran_seconds: dict[str, float] = {}  # module -> seconds its tests' setup, call and teardown took in this run


def pytest_runtest_logreport(report):
    module = Path(report.fspath).stem
    _ran_seconds[module] = _ran_seconds.get(module, 0.0) + report.duration


def pytest_sessionfinish(session):
    shut_grading_pool()
    if not _ran_seconds or not _records(session.config):
        return
    recorded = json.loads(RECORDED_SECONDS.read_text()) if RECORDED_SECONDS.exists() else {}
    tier = recorded.setdefault(session.config.option.markexpr or "", {})
    tier.update({module: round(seconds) for module, seconds in _ran_seconds.items()})
    RECORDED_SECONDS.parent.mkdir(exist_ok=True)
    written = RECORDED_SECONDS.with_suffix(f".{os.getpid()}")  # whole or not at all: others run tests here too
    written.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    os.replace(written, RECORDED_SECONDS)


def pytest_collection_modifyitems(config, items):
    """A test that grades through the real pipeline (its fixtures say so) is marked ``pipeline``;
    modules are put in the order ``_module_order`` gives."""
    for item in items:
        if PIPELINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pipeline)
    order = _module_order(items, module_seconds(config.option.markexpr or ""))
    items.sort(key=lambda item: order[item.path.stem])  # stable: a module's own order stays


def _module_order(items, seconds: dict[str, float]) -> dict[str, tuple]:
    """The order in which ``make test``'s two workers take whole modules (pytest-xdist ``--dist
    loadfile --no-loadscope-reorder`` keeps it): the book's builder first, so that the book is
    built (on a fresh clone, every chapter executed: many minutes) while the other worker grades;
    then the modules that do not read the book, the longest first, so that neither worker is left
    with a long one at the end; then the book's other readers, the longest first (ties by name)."""
    reads_book = {item.path.stem for item in items if "book" in getattr(item, "fixturenames", ())}
    return {item.path.stem: (0 if item.path.stem == BOOK_BUILDER else 2 if item.path.stem in reads_book else 1,
                             -seconds.get(item.path.stem, 0), item.path.stem) for item in items}
