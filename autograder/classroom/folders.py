"""The folders a class command writes into: made absolute, and never one of the project's own."""
from __future__ import annotations

from pathlib import Path

from coursekit.conventions import ROOT

# Folders of the repository that hold its own sources or tools: a class folder (an
# nbgrader course: source/, release/, submitted/, gradebook.db, ...) must not land in
# one of them, nor be the repository itself (its source/ holds the instructor notebooks).
PROJECT_FOLDERS = ("course", "chapters", "source", "solutions", "coursegen", "coursekit", "autograder",
                   "tests", "examples", "benchmarks", "_build", ".ci", ".cache", ".git", ".venv")


class FolderError(ValueError):
    """A folder given on the command line cannot be used (one line)."""


def class_folder(path: Path | str, flag: str = "--course") -> Path:
    """``path`` resolved against the current directory; FolderError if it is a project folder."""
    folder = Path(path).expanduser().resolve()
    if folder == ROOT:
        raise FolderError(f"{flag} {path}: that is the repository itself; give a folder of its own "
                          "for the class, e.g. my-class")
    for name in PROJECT_FOLDERS:
        own = ROOT / name
        if folder == own or own in folder.parents:
            raise FolderError(f"{flag} {path}: {own.relative_to(ROOT)}/ holds the project's own files; "
                              "give a folder of its own for the class, e.g. my-class")
    if folder.exists() and not folder.is_dir():
        raise FolderError(f"{flag} {path}: not a folder")
    return folder


def existing_folder(path: Path | str, what: str) -> Path:
    """``path`` resolved; FolderError unless it is an existing folder."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise FolderError(f"{what} {path}: no such folder")
    return folder
