"""What a platform's package carries, and how it grades one submission there.

A package holds the grader (``autograder/``, ``coursekit/``), its chapters' hidden material
(its instructor notebooks, reference and hidden-test modules, its source, which names the
chapter) and the feedback's translations: ``write_grader`` copies them into a folder of their
own, which the submission's kernel never sees (bubblewrap shows it no folder of the package;
without bubblewrap the audit hook denies it the grader's folder, see ``isolation``).
``grade_one`` grades one file there and says what happened in a ``Graded``: never an exception.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

from coursekit import conventions as C

PACKAGE_FILE = "platform.json"  # in the grader's folder: the chapter it grades
ISOLATION_VARIABLE = "ATTN_PLATFORM_ISOLATION"  # auto (default), sandbox, audit-hook
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")


def write_grader(chapters: list[str], dest: Path) -> Path:
    """The grader and the CHAPTERS' hidden material, copied into DEST (made; it must not exist)."""
    for chapter in chapters:
        if chapter not in C.chapter_names() or not C.instructor_notebook(chapter).exists():
            raise ValueError(f"unknown chapter {chapter!r} (known: {', '.join(C.chapter_names())})")
    dest.mkdir(parents=True)
    for package in ("autograder", "coursekit"):
        shutil.copytree(C.ROOT / package, dest / package, ignore=SKIPPED)
    solutions = dest / C.SOLUTIONS_PACKAGE
    solutions.mkdir()
    shutil.copy2(C.ROOT / C.SOLUTIONS_PACKAGE / "__init__.py", solutions / "__init__.py")
    (dest / "course").mkdir()
    for chapter in chapters:
        for module in (C.reference_module(chapter), C.hidden_module(chapter)):
            name = module.rpartition(".")[2] + ".py"
            shutil.copy2(C.ROOT / C.SOLUTIONS_PACKAGE / name, solutions / name)
        for language in C.EDITIONS:  # a class may hand in either edition
            notebook = C.instructor_notebook(chapter, language)
            if notebook.exists():
                shutil.copytree(notebook.parent, dest / notebook.parent.relative_to(C.ROOT), ignore=SKIPPED)
        shutil.copy2(C.COURSE_DIR / f"{chapter}.py", dest / "course" / f"{chapter}.py")  # chapter_names() reads it
    for language in C.TRANSLATIONS:
        po = C.LOCALES_DIR / language / "LC_MESSAGES" / "feedback.po"
        (dest / po.parent.relative_to(C.ROOT)).mkdir(parents=True, exist_ok=True)
        shutil.copy2(po, dest / po.relative_to(C.ROOT))
    shutil.copy2(C.ROOT / "requirements.txt", dest / "requirements.txt")
    # every chapter's name: the package grades one, and refuses a notebook of another
    (dest / PACKAGE_FILE).write_text(json.dumps({"chapters": chapters, "course": C.chapter_names()}) + "\n")
    return dest


def packaged_chapters(grader: Path) -> list[str]:
    """The chapters the package in GRADER grades."""
    return json.loads((grader / PACKAGE_FILE).read_text())["chapters"]


def bubblewrap_works() -> str | None:
    """None when bubblewrap can make the sandbox's namespaces here, else why not (one line).

    A container may have bwrap and still refuse it a user namespace (Docker's default seccomp
    profile does, without CAP_SYS_ADMIN): the kernel would then fail to start."""
    from ..sandbox import SandboxUnavailable, bubblewrap
    try:
        bwrap = bubblewrap()
    except SandboxUnavailable as err:
        return str(err)
    proc = subprocess.run([bwrap, "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000",
                           "--die-with-parent", "--cap-drop", "ALL", "--disable-userns",
                           "--ro-bind", "/", "/", "true"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        return f"bubblewrap cannot make its namespaces here: {proc.stderr.strip()[:200] or proc.returncode}"
    return None


def isolation(choice: str = "auto") -> tuple[bool, str]:
    """(sandboxed, what isolates the kernel, one line) for CHOICE: 'sandbox' requires bubblewrap,
    'audit-hook' does without it, 'auto' takes bubblewrap where it works."""
    if choice not in ("auto", "sandbox", "audit-hook"):
        raise ValueError(f"{ISOLATION_VARIABLE}={choice}: takes auto, sandbox or audit-hook")
    if choice == "audit-hook":
        return False, "the audit hook alone (asked for): no OS sandbox"
    why_not = bubblewrap_works()
    if why_not is None:
        return True, "the OS sandbox (bubblewrap: namespaces, seccomp, rlimits)"
    if choice == "sandbox":
        from ..sandbox import SandboxUnavailable
        raise SandboxUnavailable(why_not)
    return False, f"the audit hook alone: {why_not}"


@dataclasses.dataclass
class Graded:
    """One submission's outcome on a platform: REPORT when it was graded, else REFUSED (the
    learner's one line: not a notebook of this chapter) or FAILED (the grader's own failure)."""
    chapter: str
    isolation: str
    seconds: float
    report: object = None  # autograder.report.Report
    refused: str | None = None
    failed: str | None = None


def find_notebook(folder: Path, chapter: str) -> Path | None:
    """The submitted notebook in FOLDER, whatever its name: <chapter>.ipynb first, else the first
    .ipynb in name order. Hidden folders (checkpoints) are left out, and so is every link: a
    submission's link to the package's instructor notebook would be graded as the learner's."""
    found = []
    for top, folders, files in os.walk(folder, followlinks=False):
        folders[:] = sorted(f for f in folders if not f.startswith(".") and not os.path.islink(os.path.join(top, f)))
        found += [Path(top, f) for f in files if f.endswith(".ipynb") and not f.startswith(".")
                  and not os.path.islink(os.path.join(top, f)) and os.path.isfile(os.path.join(top, f))]
    found.sort()
    own = [p for p in found if p.name == f"{chapter}.ipynb"]
    return (own or found or [None])[0]


def grade_one(folder: Path, chapter: str, private: tuple[Path, ...] = (), choice: str = "auto") -> Graded:
    """Grade the notebook submitted in FOLDER as CHAPTER (never an exception: a Graded says)."""
    import time
    start = time.monotonic()
    from ..api import SandboxUnavailable, SubmissionError, grade_notebook
    path = find_notebook(folder, chapter) if folder.is_dir() else None
    how = "not graded"
    try:
        sandboxed, how = isolation(choice)
        if path is None:
            raise SubmissionError(f"no notebook (.ipynb) was submitted; submit your {chapter}.ipynb")
        _refuse_another_chapter(path, chapter)
        report = grade_notebook(path, chapter, sandboxed=sandboxed, private=private)
        return Graded(chapter, how, time.monotonic() - start, report=report)
    except SubmissionError as err:
        return Graded(chapter, how, time.monotonic() - start, refused=str(err))
    except (SandboxUnavailable, Exception) as err:  # noqa: BLE001 - the platform gets a result, never a traceback
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return Graded(chapter, how, time.monotonic() - start, failed=f"{type(err).__name__}: {first}"[:500])


def write_results(folder: Path, data: dict, graded: Graded, summary: str) -> None:
    """FOLDER/results.json (whole or not at all: a platform reads it once the script ends), and the
    job's log line for the instructor: SUMMARY, the seconds, the isolation, a grader failure."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json.part").write_text(json.dumps(data, ensure_ascii=False))
    (folder / "results.json.part").replace(folder / "results.json")
    print(f"{graded.chapter}: {summary} in {graded.seconds:.1f} s; kernel isolated by {graded.isolation}")
    if graded.failed:
        print(f"grader failure: {graded.failed}")


def _refuse_another_chapter(path: Path, chapter: str) -> None:
    """A notebook whose metadata names another chapter of the course is refused, as ``grade``
    refuses it (the package holds one chapter, so ``submission.load`` knows no other)."""
    from ..submission import MAX_FILE_BYTES, SubmissionError
    if path.stat().st_size > MAX_FILE_BYTES:
        return  # load() refuses it, and says why
    try:
        own = json.loads(path.read_bytes().decode("utf-8"))["metadata"]["course"]["chapter"]
    except (ValueError, KeyError, TypeError):
        return  # load() says what is wrong with it, or it is this chapter's without metadata
    package = C.ROOT / PACKAGE_FILE
    course = json.loads(package.read_text())["course"] if package.exists() else C.chapter_names()
    if own != chapter and own in course:
        raise SubmissionError(f"{path.name}: this is a notebook of {own}, not of {chapter}; "
                              f"submit your {chapter}.ipynb here")


def warm(grader: Path) -> str:
    """The one-time work a platform's image does (setup.sh, the Dockerfile): each chapter's scratch
    nbgrader course built into the cache; returns the isolation this machine gives."""
    from ..chapters import known
    from ..template import course_template
    for chapter in packaged_chapters(grader):
        info = known()[chapter]
        info.hidden()  # the hidden tests import
        course_template(info)
    return isolation()[1]
