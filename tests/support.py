"""Helpers test modules import (never fixtures: those stay in ``conftest.py``).

* ``ROOT``, the repository; ``submission``, ``reference_answers``, ``learner_notebook`` (from
  ``coursekit.sample_submissions``);
* ``grade_notebooks``: the real pipeline (nbgrader autograde in the sandboxed kernel), in the run's
  two grading processes (``grading_pool``); ``written`` saves notebooks where the grader reads them;
* ``judge_notebooks``: in process (``autograder.inprocess.grade_forked``), each notebook in a process
  forked from a worker that has prepared its chapter;
* ``scores_by_test``: a result's outcomes by test id, as one line each for assertions.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
# The test scheduler's default seconds per module (conftest), until a run records its own.
DEFAULT_MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")
sys.path.insert(0, str(ROOT))

from coursekit.sample_submissions import learner_notebook, reference_answers, submission  # noqa: E402,F401


_kernels = None  # per grading process: its KernelRelay (the next notebook's kernel boots while one is graded)


def _start_grading_process():
    """A grading process closes its spare kernel (and its scratch folder) when the pool ends it."""
    import multiprocessing.util
    multiprocessing.util.Finalize(None, _close_kernels, exitpriority=10)


def _close_kernels():
    if _kernels is not None:
        _kernels.close()


def _grade_one(path: str, limits: dict | None = None):
    global _kernels
    import dataclasses
    import warnings
    warnings.filterwarnings("ignore")
    from autograder.grading import KernelRelay, KernelSlot, grade
    from autograder.sandbox import Limits
    _kernels = _kernels or KernelRelay()
    try:
        if limits:  # a kernel of its own, started under these limits (the relay's have the defaults)
            slot = KernelSlot(limits=dataclasses.replace(Limits.from_environment(), **limits))
        else:
            slot = _kernels.take(Path(path))
        return grade(Path(path), slot=slot).as_result()
    except Exception as err:  # noqa: BLE001
        return {"error": f"{type(err).__name__}: {err}"}


_grading_pool = None  # per pytest process: two grading processes, started on first use, kept for the run


def grading_pool() -> concurrent.futures.ProcessPoolExecutor:
    """Two grading processes (one per core) for the whole run: each imports torch, nbgrader and
    the grader once (seconds of processor time), not once per module that grades."""
    global _grading_pool
    if _grading_pool is None:
        _grading_pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=2, mp_context=multiprocessing.get_context("spawn"), initializer=_start_grading_process)
    return _grading_pool


def shut_grading_pool() -> None:
    """End the run's grading processes, if any were started."""
    if _grading_pool is not None:
        _grading_pool.shutdown()


def written(notebooks: dict[str, nbformat.NotebookNode], tmp: Path) -> dict[str, str]:
    """Each notebook saved as ``tmp/<name>/<chapter>.ipynb`` (the grader reads the chapter from the
    file name); name -> path."""
    paths = {}
    for name, nb in notebooks.items():
        folder = tmp / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{nb.metadata['course']['chapter']}.ipynb"
        nbformat.write(nb, path)
        paths[name] = str(path)
    return paths


def grade_notebooks(notebooks: dict[str, nbformat.NotebookNode], tmp: Path,
                    limits: dict[str, dict] | None = None) -> dict[str, dict]:
    """Grade many submissions through the real pipeline, in the run's two grading processes
    (``grading_pool``); LIMITS: name -> the sandbox limits (``sandbox.Limits`` fields) to grade it under."""
    paths = written(notebooks, tmp)
    return dict(zip(paths, grading_pool().map(_grade_one, paths.values(),
                                              [(limits or {}).get(name) for name in paths])))


def scores_by_test(result: dict) -> dict[str, str]:
    """test id -> "test (score/points): message | ..." (or ": passed"), told from the result's
    ``outcomes`` (``Report.as_result``), for assertions."""
    return {o["test_id"]: " | ".join(f"{o['test_id']} ({o['score']:g}/{o['points']:g}): {message}"
                                     for message in [v["message"] for v in o["verdicts"]] or ["passed"])
            for o in result["outcomes"]}


def _judge_one(path: str):
    import warnings
    warnings.filterwarnings("ignore")
    os.environ.setdefault("MPLBACKEND", "Agg")  # in the worker only: kernels that tests start draw inline
    from autograder.inprocess import grade_forked
    return grade_forked([Path(path)])[0]


def judge_notebooks(notebooks: dict[str, nbformat.NotebookNode], tmp: Path) -> dict[str, dict]:
    """Judge many submissions in process: two workers (from a server that has imported torch and
    the grader), each preparing the chapter's probes and reference results once and grading each
    notebook in a process forked from there (so nothing one notebook does reaches another)."""
    paths = written(notebooks, tmp)
    ctx = multiprocessing.get_context("forkserver")
    # nbgrader takes about 3 s to import (coursekit.conventions.is_test_cell needs it): once, not per notebook
    ctx.set_forkserver_preload(["torch", "nbformat", "nbgrader.utils", "autograder.inprocess", "autograder.judge.cells"])
    with ctx.Pool(2) as pool:  # a worker prepares a chapter once and forks a child per notebook
        return dict(zip(paths, pool.map(_judge_one, paths.values(), chunksize=1)))
