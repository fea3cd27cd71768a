"""The folders a class command writes into (made absolute, never one of the project's own, and never a
folder of the checkout that git would stage), and the names a submission brings into them (a student
id: ``student_id``)."""
from __future__ import annotations

import unicodedata
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
    if ROOT in folder.parents and not _ignored_by_git(folder):
        raise FolderError(f"{flag} {path}: inside the repository's checkout, where `git add -A` would stage the "
                          "class's grades, student ids and answers; give a folder outside it, e.g. "
                          f"{CLASSES_HOME}/{folder.name} (or one that .gitignore ignores, as my-class/)")
    return folder


CLASSES_HOME = "~/attention-course-classes"  # where the README suggests a class's folder


def _ignored_by_git(folder: Path) -> bool:
    """Whether git ignores FOLDER, a folder of the checkout (True without git or a .git here: nothing
    to stage it into)."""
    import subprocess
    if not (ROOT / ".git").exists():
        return True
    try:
        proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", f"{folder.relative_to(ROOT)}/"],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return True
    return proc.returncode != 1  # 0: ignored; 1: not ignored; 128: git cannot tell (not a work tree)


def existing_folder(path: Path | str, what: str) -> Path:
    """``path`` resolved; FolderError unless it is an existing folder."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise FolderError(f"{what} {path}: no such folder")
    return folder


# --------------------------------------------------------------------------- names from submissions
# A student id is a folder name (submitted/<id>/, feedback/<id>/), nbgrader's gradebook key and a
# cell of every CSV. nbgrader takes any text as an id once it strips the whitespace around it; its
# `submit` refuses '*' and '+' (the exchange's separator) and its autograde and feedback read the
# id as a file glob ('*', '?', '['). So the rule keeps Unicode as typed (NFC, so that "Zoé" from a
# Mac and from Windows is one student) and refuses only what would break a path or nbgrader, or
# fool a reader: path separators, control and bidirectional-override characters, a leading dot
# ('.', '..', hidden), a leading '=', '-' or '@' (a spreadsheet runs it as a formula), nbgrader's
# '*', '+', '?', '[', a name longer than a file name may be, and the feedback's own _static/.
MAX_ID_BYTES = 200  # a folder name (255 bytes at most) with room for feedback's "<id>-<chapter>.html"
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_NBGRADER_GLOB = "*+?["
_FORMULA_START = "=-@"
RESERVED_IDS = ("_static",)  # feedback/_static/ holds the pages' MathJax, handed to every student


def shown(text: str, limit: int = 80) -> str:
    """TEXT quoted for one line of output (Python's repr: control characters and undecodable bytes
    escaped), cut at LIMIT characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def id_problem(name: str) -> str | None:
    """Why NAME (already NFC and stripped) cannot be a student id, or None."""
    if not name:
        return "an empty name"
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in name):
        return "not valid UTF-8"
    if "/" in name or "\\" in name:
        return "a path separator in it"
    if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI_CONTROLS for ch in name):
        return "a control or text-direction character in it"
    if name.startswith("."):
        return "it starts with a dot"
    if name[0] in _FORMULA_START:
        return f"it starts with {name[0]!r}, which makes a spreadsheet read the CSVs' cell as a formula"
    bad = sorted({ch for ch in name if ch in _NBGRADER_GLOB})
    if bad:
        return (f"{' '.join(map(repr, bad))} in it (nbgrader reads a student id as a file glob, and its "
                "submit refuses '*' and '+')")
    if len(name.encode("utf-8")) > MAX_ID_BYTES:
        return f"longer than {MAX_ID_BYTES} bytes"
    if name in RESERVED_IDS:
        return f"feedback/{name}/ holds the feedback pages' MathJax"
    return None


def student_id(raw: str, what: str = "name") -> str:
    """RAW as a student id: NFC, whitespace around it stripped (as nbgrader strips it); ValueError
    (one line, saying why) if it cannot be one."""
    name = unicodedata.normalize("NFC", raw).strip()
    problem = id_problem(name)
    if problem:
        raise ValueError(f"{what} {shown(raw)} cannot be a student id: {problem}")
    return name


def inside(folder: Path, path: Path) -> bool:
    """Whether PATH, with every link in it followed, lies in FOLDER (itself resolved)."""
    folder = Path(folder).resolve()
    resolved = Path(path).resolve()
    return resolved == folder or folder in resolved.parents
