"""Read a submitted notebook and say in one line why it cannot be graded, if it cannot."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat

from .chapters import ChapterInfo, known

MAX_BYTES = 50 * 1024 * 1024


class SubmissionError(Exception):
    """The file is not a gradable notebook of this course (message: one line)."""


def load(path: Path, chapter: str | None = None) -> tuple[nbformat.NotebookNode, ChapterInfo]:
    """Parse a submission; return it (nbformat 4) and its chapter."""
    path = Path(path)
    if not path.is_file():
        raise SubmissionError(f"{path}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise SubmissionError(f"{path.name}: the file is empty")
    if size > MAX_BYTES:
        raise SubmissionError(f"{path.name}: the file is {size // 2**20} MiB, over the 50 MiB limit")
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise SubmissionError(f"{path.name}: not a notebook (not valid JSON: {err})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        raise SubmissionError(f"{path.name}: JSON but not a notebook (no list of cells)")
    major = raw.get("nbformat")
    if major != 4:
        raise SubmissionError(
            f"{path.name}: notebook format {major!r} is not supported; save it as nbformat 4 "
            "(any current Jupyter does)")
    try:
        nb = nbformat.reads(json.dumps(raw), as_version=4)
    except Exception as err:  # noqa: BLE001 - nbformat raises many kinds
        raise SubmissionError(f"{path.name}: not a valid notebook ({str(err).splitlines()[0][:200]})") from None
    chapters = known()
    name = chapter or _chapter_name(path, nb, chapters)
    if name not in chapters:
        raise SubmissionError(
            f"{path.name}: cannot tell which chapter this is (file name or metadata "
            f"course.chapter should be one of: {', '.join(chapters) or 'none'})")
    return nb, chapters[name]


def _chapter_name(path: Path, nb, chapters) -> str | None:
    if path.stem in chapters:
        return path.stem
    meta = nb.metadata.get("course", {})
    return meta.get("chapter") if isinstance(meta, dict) else None
