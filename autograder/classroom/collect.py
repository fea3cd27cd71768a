"""Find submissions: collect them into a course folder, list them, split them into shards."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
from pathlib import Path

from ..chapters import known

STUDENT_ID = re.compile(r"[^A-Za-z0-9_.@-]+")


@dataclasses.dataclass(frozen=True)
class Task:
    student: str
    chapter: str
    path: Path

    @property
    def key(self) -> str:
        return f"{self.student}/{self.chapter}"


def student_id(raw: str) -> str:
    return STUDENT_ID.sub("_", raw).strip("._") or "unknown"


def collect(source: Path, course: Path, chapter: str | None = None) -> list[Task]:
    """Copy submissions into COURSE/submitted/<student>/<chapter>/<chapter>.ipynb.

    Accepts nbgrader's layout (``[submitted/]<student>/<chapter>/<file>.ipynb``) and a
    flat folder of ``<student>.ipynb`` files (an LMS download), whose chapter comes from
    --chapter or from each notebook's metadata.
    """
    source, course = Path(source).resolve(), Path(course).resolve()
    source = source / "submitted" if (source / "submitted").is_dir() else source
    chapters = known()
    found: list[Task] = []
    for path in sorted(source.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        rel = path.relative_to(source).parts
        if len(rel) >= 3 and rel[-2] in chapters:
            student, name = student_id(rel[-3]), rel[-2]
        elif len(rel) == 1:
            student, name = student_id(path.stem), chapter or _chapter_from_metadata(path) or "unknown"
        else:
            continue
        target = course / "submitted" / student / name / f"{name}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.resolve() != target.resolve():
            shutil.copyfile(path, target)
        found.append(Task(student, name, target))
    return found


def _chapter_from_metadata(path: Path) -> str | None:
    try:
        meta = json.loads(path.read_text()).get("metadata", {}).get("course", {})
        return meta.get("chapter") if isinstance(meta, dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def submissions(course: Path, chapters: list[str] | None = None) -> list[Task]:
    tasks = []
    for path in sorted((course / "submitted").glob("*/*/*.ipynb")):
        student, chapter = path.parts[-3], path.parts[-2]
        if chapters and chapter not in chapters:
            continue
        tasks.append(Task(student, chapter, path))
    return tasks


def in_shard(task: Task, shard: tuple[int, int] | None) -> bool:
    if shard is None:
        return True
    index, count = shard
    digest = int(hashlib.sha256(task.key.encode()).hexdigest()[:12], 16)
    return digest % count == index - 1
