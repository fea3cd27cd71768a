"""Release chapters into an nbgrader course folder (generate_assignment), or into a plain folder."""
from __future__ import annotations

import shutil
from pathlib import Path

from coursekit import conventions as C
from coursekit.conventions import COURSE_ID
from coursekit.nbgrader_course import generate_assignment

from ..chapters import ChapterInfo
from .folders import class_folder


def release(course: Path, chapters: list[ChapterInfo], plain_folder: Path | None = None) -> list[Path]:
    """generate_assignment for each chapter, the learner notebook in its release; optionally copied to a folder."""
    course = class_folder(course)
    plain_folder = class_folder(plain_folder, "--to") if plain_folder is not None else None
    course.mkdir(parents=True, exist_ok=True)
    config = course / "nbgrader_config.py"  # so that nbgrader's own commands work in the folder
    if not config.exists():
        config.write_text(f"c = get_config()\nc.CourseDirectory.course_id = {COURSE_ID!r}\n")
    made = []
    for info in chapters:
        out = generate_assignment(course, info.name, info.instructor_notebook)
        # What learners get is the learner notebook: nbgrader's release with its MyST made plain
        # (the generator's; the same cells and metadata, so the gradebook still holds for it).
        shutil.copyfile(C.learner_notebook(info.name, info.language), out)
        if plain_folder is not None:
            plain_folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out, plain_folder / out.name)
            out = plain_folder / out.name
        made.append(out)
    return made
