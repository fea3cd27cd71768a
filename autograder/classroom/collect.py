"""Find submissions: collect them into a course folder, list them, split them into shards.

``collect`` reads nbgrader's layout (``<student>/<chapter>/<notebook>.ipynb``) and an LMS
download: a flat folder of ``<student>.ipynb``, Canvas's names
(``<name>[_LATE]_<user id>_<file id>_<file>.ipynb``, ``<file>-1.ipynb`` for a file uploaded again)
and Moodle's (``<Full Name>_<id>_assignsubmission_file_/<file>.ipynb``, or the same flat). Every
name a submission brings (student, chapter) is checked before it touches a path: a student id by
``folders.student_id``, a chapter against the course's. One student's files for one chapter are
one submission: the latest (by the file's time, then the LMS's file id and upload count) is
``submitted/<student>/<chapter>/<chapter>.ipynb``, each other one is kept in that folder's
``.older/`` (nbgrader reads ``<chapter>/*.ipynb`` only), and two different files equally late
are both refused. Nothing is overwritten or left out without a line saying so (``Outcome.line``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
import time
from pathlib import Path

from ..chapters import known
from .folders import id_problem, inside, shown, student_id

CANVAS = re.compile(r"(?P<name>[^_]+?)(?P<late>_late)?_(?P<user>\d+)_(?P<file_id>\d+)_(?P<file>.+)", re.I)
CANVAS_AGAIN = re.compile(r"(?P<base>.+)-(?P<count>\d+)")  # Canvas's name for a file uploaded again
MOODLE_FOLDER = re.compile(r"(?P<name>.+)_(?P<user>\d+)_assignsubmission_file_?")
MOODLE_FILE = re.compile(r"(?P<name>.+)_(?P<user>\d+)_assignsubmission_file_(?P<file>.+)")
OLDER = ".older"  # submitted/<student>/<chapter>/.older/: the other files of that submission
LOG = "collect-log.txt"  # in the course folder: every collect's lines, appended
MAX_METADATA_BYTES = 256 * 2**20  # the grader's own limit on a submitted file (submission.MAX_FILE_BYTES)
NBGRADER_FOLDERS = ("source", "release", "submitted", "autograded", "feedback")
LAYOUTS = ("not in a layout collect reads (<student>/<chapter>/<notebook>.ipynb, <student>.ipynb, "
           "or a Canvas or Moodle download, at the top of the folder collected)")


@dataclasses.dataclass(frozen=True)
class Task:
    student: str
    chapter: str
    path: Path

    @property
    def key(self) -> str:
        return f"{self.student}/{self.chapter}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What collect did with one file of the source: its line of output."""
    source: str            # the file, relative to the source folder
    action: str            # collected, older, unchanged, refused, skipped
    detail: str
    task: Task | None = None

    def line(self) -> str:
        return f"{shown(self.source, 120)}: {self.detail}"


@dataclasses.dataclass
class _File:
    rel: str
    path: Path
    student: str
    chapter: str
    when: int = 0                    # the file's time (ns)
    order: tuple = ()                # the LMS's order of one student's files: (file id, upload count)
    lms: tuple | None = None         # (LMS, its user id)
    sha: str = ""

    def key(self) -> tuple:
        return (self.when, self.order)


class _Refused(Exception):
    """One file cannot be collected (the reason, one line)."""


def collect(source: Path, course: Path, chapter: str | None = None) -> list[Outcome]:
    """Copy submissions into COURSE/submitted/<student>/<chapter>/<chapter>.ipynb; one Outcome per file.

    A flat folder's chapter comes from CHAPTER (--chapter), else the LMS's file name, else the
    notebook's metadata. Also appends the lines to COURSE/collect-log.txt.
    """
    source, course = Path(source).resolve(), Path(course).resolve()
    nested = source / "submitted"
    root = nested if nested.is_dir() and not nested.is_symlink() else source
    chapters = known()
    if chapter is not None and chapter not in chapters:
        raise ValueError(f"unknown chapter: {shown(chapter)} (known: {', '.join(chapters)})")
    outcomes: list[Outcome] = []
    found: list[_File] = []
    for path in _walk(root, course, outcomes):
        rel = str(path.relative_to(root))
        try:
            item = _classify(path, path.relative_to(root).parts, chapters, chapter)
        except (_Refused, OSError) as why:
            outcomes.append(Outcome(rel, "refused", f"refused: {_reason(why)}"))
            continue
        if isinstance(item, str):
            outcomes.append(Outcome(rel, "skipped", f"skipped: {item}"))
            continue
        own = _chapter_from_metadata(path)
        if isinstance(own, str) and own in chapters and own != item.chapter:  # the grader would refuse it too
            outcomes.append(Outcome(rel, "refused", f"refused: a notebook of {own} (its metadata course.chapter), "
                                                    f"not of {item.chapter}"))
            continue
        found.append(item)
    found = _one_person_per_name(found, outcomes)
    groups: dict[tuple[str, str], list[_File]] = {}
    for item in found:
        groups.setdefault((item.student, item.chapter), []).append(item)
    for (student, name), items in sorted(groups.items()):
        outcomes += _file_submission(course, student, name, items)
    outcomes.sort(key=lambda o: o.source)
    _log(course, source, outcomes)
    return outcomes


# ------------------------------------------------------------------ reading the source
def _walk(root: Path, course: Path, outcomes: list[Outcome]):
    """Every file under ROOT, in order, never through a symbolic link; folders not read are noted."""
    def note(path: Path, action: str, detail: str):
        outcomes.append(Outcome(str(path.relative_to(root)) + "/", action, detail))

    def unreadable(err: OSError):
        outcomes.append(Outcome(str(Path(err.filename).relative_to(root)) if err.filename else str(root),
                                "refused", f"refused: cannot be read ({err.strerror})"))

    for folder, folders, files in os.walk(root, onerror=unreadable):
        here = Path(folder)
        keep = []
        for name in sorted(folders):
            path = here / name
            if path.is_symlink():
                note(path, "refused", f"refused: a symbolic link (to {shown(os.readlink(path))}), not followed")
            elif name == ".ipynb_checkpoints":
                note(path, "skipped", "skipped: Jupyter's checkpoints")
            elif name.startswith(".") or name == "__MACOSX":
                note(path, "skipped", "skipped: a hidden folder")
            elif path.resolve() == course:
                note(path, "skipped", "skipped: the course folder itself")
            else:
                keep.append(name)
        folders[:] = keep
        for name in sorted(files):
            yield here / name


def _classify(path: Path, parts: tuple[str, ...], chapters: dict, given: str | None) -> _File | str:
    """The student and chapter of one file of the source, or why it is skipped (a str); _Refused."""
    name = parts[-1]
    if path.is_symlink():
        raise _Refused(f"a symbolic link (to {shown(os.readlink(path))}), not read")
    if name.startswith("."):
        return "a hidden file"
    if not name.lower().endswith(".ipynb"):
        return "not a notebook"
    if not stat.S_ISREG(path.lstat().st_mode):
        raise _Refused("not a regular file")
    stem = name[:-len(".ipynb")]
    lms, order, file_part = None, (), None
    if len(parts) > 3:
        raise _Refused(LAYOUTS)
    if len(parts) == 3:  # nbgrader's layout: <student>/<chapter>/<notebook>.ipynb
        if parts[1] not in chapters:
            raise _Refused(f"in a folder {shown(parts[1])}, which is not a chapter of the course "
                           f"(nbgrader's layout is <student>/<chapter>/<notebook>.ipynb; chapters: {', '.join(chapters)})")
        if parts[0] in NBGRADER_FOLDERS:
            raise _Refused(f"{parts[0]}/ is a folder of an nbgrader course, not a student; collect its submitted/")
        return _File(str(Path(*parts)), path, _student(parts[0], "folder name"), parts[1])
    if len(parts) == 2:  # Moodle's folders: <Full Name>_<id>_assignsubmission_file_/<file>.ipynb
        folder = MOODLE_FOLDER.fullmatch(parts[0])
        if not folder:
            raise _Refused(LAYOUTS)
        raw, lms, file_part = folder["name"], ("Moodle", folder["user"]), stem
    elif (canvas := CANVAS.fullmatch(stem)):
        raw, lms, file_part = canvas["name"], ("Canvas", canvas["user"]), canvas["file"]
        again = CANVAS_AGAIN.fullmatch(file_part)
        order = (int(canvas["file_id"]), int(again["count"]) if again else 0)
        file_part = again["base"] if again and again["base"] in chapters else file_part
    elif (moodle := MOODLE_FILE.fullmatch(stem)):
        raw, lms, file_part = moodle["name"], ("Moodle", moodle["user"]), moodle["file"]
    else:
        if stem in chapters:
            raise _Refused(f"named like a chapter, not a student: a flat folder holds <student>.ipynb "
                           f"(nbgrader's layout: <student>/{stem}/{name})")
        raw = stem
    return _File(str(Path(*parts)), path, _student(raw, "name"), _chapter(path, file_part, chapters, given),
                 lms=lms, order=order)


def _student(raw: str, what: str) -> str:
    try:
        return student_id(raw, what)
    except ValueError as err:
        raise _Refused(str(err)) from None


def _chapter(path: Path, file_part: str | None, chapters: dict, given: str | None) -> str:
    """A flat file's chapter: --chapter, else the LMS's file name, else the notebook's metadata."""
    if given:
        return given
    if file_part in chapters:
        return file_part
    meta = _chapter_from_metadata(path)
    if meta is None:
        raise _Refused("cannot tell its chapter: its metadata names none (give --chapter)")
    if not isinstance(meta, str) or meta not in chapters:
        raise _Refused(f"its metadata names chapter {shown(str(meta), 60)}, which is not a chapter of the course "
                       f"(chapters: {', '.join(chapters)}; or give --chapter)")
    return meta


def _chapter_from_metadata(path: Path):
    try:
        if path.stat().st_size > MAX_METADATA_BYTES:
            return None
        meta = json.loads(path.read_bytes().decode("utf-8")).get("metadata", {}).get("course", {})
        return meta.get("chapter") if isinstance(meta, dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def _one_person_per_name(found: list[_File], outcomes: list[Outcome]) -> list[_File]:
    """Files an LMS gives one name but two of its users' ids are two students collect cannot tell
    apart: refused, each line naming another such file."""
    ids: dict[str, dict[tuple, _File]] = {}
    for item in found:
        if item.lms:
            ids.setdefault(item.student, {}).setdefault(item.lms, item)
    kept = []
    for item in found:
        people = ids.get(item.student, {})
        if item.lms and len(people) > 1:
            other = next(f for lms, f in people.items() if lms != item.lms)
            outcomes.append(Outcome(item.rel, "refused", (
                f"refused: {item.lms[0]} user {item.lms[1]} and user {other.lms[1]} ({shown(other.rel)}) are both "
                f"named {shown(item.student)}; rename their files <student>.ipynb with ids that tell them apart")))
        else:
            kept.append(item)
    return kept


def _open(path: Path) -> int:
    """A file descriptor for PATH, never through a symbolic link, never a FIFO or device."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _Refused("not a regular file")
    return fd


def _hash(path: Path) -> tuple[str, int]:
    """The sha256 and the modification time (ns) of a file of the source."""
    fd = _open(path)
    with os.fdopen(fd, "rb") as f:
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
        return digest.hexdigest(), os.fstat(f.fileno()).st_mtime_ns


# ------------------------------------------------------------------ writing the course folder
def _file_submission(course: Path, student: str, chapter: str, items: list[_File]) -> list[Outcome]:
    """One student's files of one chapter into the course: the latest is the submission, the others
    are kept in .older/ (or were already there); files equally late and different are refused."""
    out: list[Outcome] = []
    try:
        folder = _folder(course, student, chapter)
    except _Refused as why:
        return [Outcome(i.rel, "refused", f"refused: {why}") for i in items]
    current = folder / f"{chapter}.ipynb"
    shown_current = f"submitted/{student}/{chapter}/{chapter}.ipynb"
    task = Task(student, chapter, current)
    fresh: list[_File] = []
    for item in items:
        try:
            item.sha, item.when = _hash(item.path)
        except (_Refused, OSError) as why:
            out.append(Outcome(item.rel, "refused", f"refused: {_reason(why)}"))
            continue
        fresh.append(item)
    have = None
    if current.is_file() and not current.is_symlink():
        sha, when = _hash(current)
        have = _File(shown_current, current, student, chapter, when=when, sha=sha)
    older = _older_hashes(folder)
    who = f"student {shown(student)}, chapter {chapter}"
    pool: list[_File] = [have] if have else []
    firsts: dict[str, _File] = {}
    for item in fresh:
        if item.path.resolve() == current.resolve() or (have and item.sha == have.sha):
            out.append(Outcome(item.rel, "unchanged", f"already collected as {who}", task))
        elif item.sha in older:
            out.append(Outcome(item.rel, "unchanged", f"already kept as an older file of {who} ({older[item.sha]})"))
        elif item.sha in firsts:
            out.append(Outcome(item.rel, "unchanged", f"the same file as {shown(firsts[item.sha].rel)}, for {who}"))
        else:
            firsts[item.sha] = item
            pool.append(item)
    if not firsts:
        return out
    pool.sort(key=_File.key, reverse=True)
    tied = [i for i in pool if i.key() == pool[0].key()]
    if len(tied) > 1:  # different files, equally late: which is the submission is not for collect to guess
        for item in tied:
            if item is have:
                continue
            other = next(i for i in tied if i is not item)
            out.append(Outcome(item.rel, "refused", (
                f"refused: as late as {shown(other.rel)} and different, both for {who}; "
                "keep the one to grade and collect again")))
        pool = [i for i in pool if i not in tied or i is have]
        latest = have
    else:
        latest = pool[0]
    if latest is not None and latest is not have:
        if have is not None:
            kept = _keep_older(folder, have.path, have.when, f"{chapter}.ipynb", move=True)
            note = f" (newer than the one collected before, now {_rel(course, kept)})"
        else:
            note = ""
        _write(latest.path, current, latest.when)
        _write_timestamp(latest, folder)
        out.append(Outcome(latest.rel, "collected", f"collected as {who}{note}", task))
    for item in pool:
        if item is have or item is latest:
            continue
        kept = _keep_older(folder, item.path, item.when, Path(item.rel).name)
        why = "later files were refused" if latest is None else \
            f"{shown(latest.rel if latest is not have else shown_current)} is later"
        out.append(Outcome(item.rel, "older", f"kept as an older file of {who}: {_rel(course, kept)} ({why})"))
    return out


def _reason(err: Exception) -> str:
    if isinstance(err, OSError):
        return f"cannot be read ({err.strerror})"
    return str(err)


def _rel(course: Path, path: Path) -> str:
    return str(path.relative_to(course))


def _folder(course: Path, student: str, chapter: str) -> Path:
    """COURSE/submitted/<student>/<chapter>, made if missing; _Refused if a part of it (or its
    .older/) is a symbolic link or a file. ValueError if submitted/ leads out of the course."""
    base = course / "submitted"
    base.mkdir(parents=True, exist_ok=True)
    if not inside(course, base):
        raise ValueError(f"{base} leads out of the course folder (a symbolic link)")
    folder = base / student / chapter
    for path in (base / student, folder, folder / OLDER):
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            raise _Refused(f"{_rel(course, path)} in the course is a symbolic link or a file, not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _older_hashes(folder: Path) -> dict[str, str]:
    """sha256 -> path (from the chapter folder) of each file kept in FOLDER/.older/."""
    older = folder / OLDER
    if not older.is_dir() or older.is_symlink():
        return {}
    out = {}
    for path in sorted(older.iterdir()):
        if path.is_file() and not path.is_symlink():
            out[_hash(path)[0]] = f"{OLDER}/{path.name}"
    return out


def _keep_older(folder: Path, path: Path, when: int, name: str, move: bool = False) -> Path:
    """PATH kept as FOLDER/.older/<UTC time>-<name> (a name of its own if NAME is not safe)."""
    older = folder / OLDER  # checked by _folder
    older.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when / 1e9))
    if id_problem(name) or not name.lower().endswith(".ipynb"):
        name = "submission.ipynb"
    base = f"{stamp}-{name}"
    target, n = older / base, 1
    while target.exists() or target.is_symlink():
        n += 1
        target = older / f"{base[:-len('.ipynb')]}-{n}.ipynb"
    if move:
        os.replace(path, target)
    else:
        _write(path, target, when)
    return target


def _write(source: Path, target: Path, when: int):
    """SOURCE's bytes at TARGET (a new file put in place whole, never written through a link),
    with SOURCE's time."""
    partial = target.with_name(f".{target.name[:100]}.partial-{os.getpid()}")
    fd = _open(source)
    with os.fdopen(fd, "rb") as src, open(partial, "xb") as dst:
        for block in iter(lambda: src.read(1 << 20), b""):
            dst.write(block)
    os.utime(partial, ns=(when, when))
    os.replace(partial, target)


def _write_timestamp(item: _File, folder: Path) -> None:
    """FOLDER/timestamp.txt, the submission's time as nbgrader's exchange writes it (``nbgrader
    autograde`` and ``grade-class`` read it for lateness): the time in the timestamp.txt beside an
    nbgrader submission, else, the last resort, the file's time (an LMS's zip keeps the upload's)."""
    import datetime

    from nbgrader.utils import parse_utc
    when = None
    beside = item.path.parent / "timestamp.txt"
    if len(Path(item.rel).parts) == 3 and beside.is_file() and not beside.is_symlink():
        try:
            with open(beside, encoding="utf-8") as f:
                when = parse_utc(f.read(200).strip())
        except (OSError, ValueError, OverflowError, UnicodeDecodeError):
            when = None
    if when is None:
        when = datetime.datetime.fromtimestamp(item.when / 1e9, datetime.timezone.utc).replace(tzinfo=None)
    partial = folder / f".timestamp.txt.partial-{os.getpid()}"
    partial.write_text(f"{when:%Y-%m-%d %H:%M:%S.%f} UTC\n")
    os.replace(partial, folder / "timestamp.txt")


def _log(course: Path, source: Path, outcomes: list[Outcome]):
    """The lines appended to COURSE/collect-log.txt (not when the course folder was never made)."""
    if not outcomes or not course.is_dir():
        return
    with open(course / LOG, "a", encoding="utf-8", errors="backslashreplace") as f:
        f.write(f"# collect {source} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        for outcome in outcomes:
            f.write(outcome.line() + "\n")


# ------------------------------------------------------------------ the course's submissions
def submissions(course: Path, chapters: list[str] | None = None, warn=None) -> list[Task]:
    """One task per student and chapter of COURSE/submitted: <student>/<chapter>/<chapter>.ipynb,
    or the folder's only notebook. Folders that cannot be graded safely (a symbolic link, a name
    that cannot be a student id, several notebooks none named for the chapter) are left out, each
    with a line to WARN (default: standard error)."""
    import sys
    warn = warn or (lambda line: print(line, file=sys.stderr))
    known_chapters = set(known())
    tasks = []
    base = Path(course) / "submitted"
    for student_folder in sorted(base.iterdir()) if base.is_dir() else ():
        student = student_folder.name
        if student.startswith(".") or not student_folder.is_dir():
            continue
        if student_folder.is_symlink() or id_problem(student) or student != student.strip():
            warn(f"submitted/{shown(student)}: left out (a symbolic link, or not a student id collect would give)")
            continue
        for folder in sorted(student_folder.iterdir()):
            chapter = folder.name
            if not folder.is_dir() or (chapters and chapter not in chapters):
                continue
            where = f"submitted/{shown(student)}/{shown(chapter)}"
            if folder.is_symlink() or chapter not in known_chapters:
                if folder.is_symlink() or not chapter.startswith("."):
                    warn(f"{where}: left out (a symbolic link, or not a chapter of the course)")
                continue
            notebooks = [p for p in sorted(folder.glob("*.ipynb")) if not p.name.startswith(".")]
            named = folder / f"{chapter}.ipynb"
            path = named if named in notebooks else notebooks[0] if len(notebooks) == 1 else None
            if path is None:
                if notebooks:
                    warn(f"{where}: left out ({len(notebooks)} notebooks, none named {chapter}.ipynb; "
                         "collect them to keep the latest)")
                continue
            if path.is_symlink():
                warn(f"{where}/{shown(path.name)}: left out (a symbolic link)")
                continue
            tasks.append(Task(student, chapter, path))
    return tasks


def in_shard(task: Task, shard: tuple[int, int] | None) -> bool:
    if shard is None:
        return True
    index, count = shard
    digest = int(hashlib.sha256(task.key.encode()).hexdigest()[:12], 16)
    return digest % count == index - 1
