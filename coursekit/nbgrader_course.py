"""The one route from this project to nbgrader: a course folder, its apps, its gradebook.

Every nbgrader operation the project runs (``generate_assignment`` for the generator,
the grader's cache and ``release``; ``autograde`` and ``generate_feedback`` for the
grader) goes through ``api``, in process, with a configuration made here.
"""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
from pathlib import Path

from .conventions import COURSE_ID, with_python_bin_on_path


def db_url(root: Path) -> str:
    return f"sqlite:///{Path(root).resolve() / 'gradebook.db'}"


def config(root: Path):
    """An nbgrader configuration for the course folder ``root`` (made absolute)."""
    from traitlets.config import Config
    c = Config()
    c.CourseDirectory.root = str(Path(root).resolve())
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.db_url = db_url(root)
    return c


@functools.lru_cache(maxsize=None)
def schema_head() -> str:
    """The revision of nbgrader's newest gradebook schema, read from its migration scripts.

    The same value nbgrader gets by running ``alembic heads`` for every new gradebook (a new
    process that takes 5-10 s: 16 gradebooks made ``coursegen --check`` take 90 s), read once.
    """
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR
    return ScriptDirectory(ALEMBIC_DIR).get_current_head()


def _new_gradebooks_read_the_schema_head_in_process():
    import nbgrader.api
    nbgrader.api.get_alembic_version = schema_head


def api(root: Path, cfg=None):
    """nbgrader's API on ``root``; ``cfg`` is a configuration from ``config`` with more set."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    os.environ["PATH"] = with_python_bin_on_path()["PATH"]  # nbgrader's database upgrades run `alembic`
    _new_gradebooks_read_the_schema_head_in_process()
    cfg = cfg if cfg is not None else config(root)
    return NbGraderAPI(coursedir=CourseDirectory(config=cfg), config=cfg)


def generate_assignment(root: Path, chapter: str, instructor_notebook: Path) -> Path:
    """Put the instructor notebook into ``root/source`` and release it; return the learner notebook."""
    root = Path(root).resolve()
    src = root / "source" / chapter
    src.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(instructor_notebook, src / f"{chapter}.ipynb")
    result = api(root).generate_assignment(chapter, force=True, create=True)
    released = root / "release" / chapter / f"{chapter}.ipynb"
    if not result["success"] or not released.exists():
        reason = (result.get("error") or result.get("log") or "no reason given").strip().splitlines()
        raise RuntimeError(f"nbgrader generate_assignment {chapter} failed: {reason[-1] if reason else ''}")
    return released


@contextlib.contextmanager
def gradebook(root: Path):
    from nbgrader.api import Gradebook
    _new_gradebooks_read_the_schema_head_in_process()
    with Gradebook(db_url(root), COURSE_ID) as gb:
        yield gb
