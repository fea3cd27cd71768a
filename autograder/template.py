"""A scratch nbgrader course per chapter, its gradebook made by generate_assignment: built once, cached."""
from __future__ import annotations

import fcntl
import hashlib
import shutil
import tempfile
from pathlib import Path

from coursekit.nbgrader_course import generate_assignment

from . import settings
from .chapters import ChapterInfo


def cache_dir() -> Path:
    return settings.current().cache


def course_template(chapter: ChapterInfo) -> Path:
    """A course folder with the chapter generated into its gradebook."""
    import nbgrader
    cache = cache_dir()
    source = chapter.instructor_notebook.read_bytes()
    key = hashlib.sha256(source + nbgrader.__version__.encode()).hexdigest()[:16]
    template = cache / f"{chapter.name}-{chapter.language}-{key}"
    if (template / "ready").exists():
        return template
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{chapter.name}-{chapter.language}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (template / "ready").exists():
            return template
        building = Path(tempfile.mkdtemp(prefix=f"{chapter.name}-", dir=cache))
        generate_assignment(building, chapter.name, chapter.instructor_notebook)
        (building / "ready").write_text("ok")
        shutil.rmtree(template, ignore_errors=True)
        building.rename(template)
    return template
