"""Grade a whole class: release, collect, grade in parallel, feedback, export, shards.

A class lives in an nbgrader course folder (the sqlite gradebook is the record):

    COURSE/
      source/<chapter>/<chapter>.ipynb         instructor notebooks (from `release`)
      release/<chapter>/<chapter>.ipynb        learner notebooks made by generate_assignment
      submitted/<student>/<chapter>/<chapter>.ipynb
      gradebook.db                             nbgrader gradebook (scores per test cell)
      feedback/<student>/<chapter>/<chapter>.html
      grades.csv, exercises.csv                exports
      .grading/ledger.jsonl                    one line per graded submission (resume, reasons)

Worker processes grade one submission each in a private scratch course (``grade``) and
send back the outcome; only this process writes the gradebook, so nothing is shared
between submissions and an interrupted run leaves every committed grade intact.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import html
import json
import multiprocessing
import os
import queue
import re
import shutil
import signal
import sys
import time
from pathlib import Path

from .chapters import ChapterInfo, known
from .env import use_python_bin_on_path

COURSE_ID = "attention-from-scratch"
STUDENT_ID = re.compile(r"[^A-Za-z0-9_.@-]+")


# ------------------------------------------------------------------ release and collect

def release(course: Path, chapters: list[ChapterInfo], plain_folder: Path | None = None) -> list[Path]:
    """generate_assignment for each chapter; optionally copy the learner notebooks to a folder."""
    use_python_bin_on_path()
    course.mkdir(parents=True, exist_ok=True)
    config = course / "nbgrader_config.py"
    if not config.exists():
        config.write_text(f"c = get_config()\nc.CourseDirectory.course_id = {COURSE_ID!r}\n")
    from .grading import _api
    api = _api(course)
    made = []
    for info in chapters:
        src = course / "source" / info.name
        src.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(info.instructor_notebook, src / f"{info.name}.ipynb")
        result = api.generate_assignment(info.name, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"generate_assignment {info.name} failed: {result.get('error', '')[-300:]}")
        out = course / "release" / info.name / f"{info.name}.ipynb"
        if plain_folder is not None:
            plain_folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out, plain_folder / out.name)
            out = plain_folder / out.name
        made.append(out)
    return made


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


# ------------------------------------------------------------------ workers

def _worker(tasks, results, feedback_root: str, private: tuple[str, ...]):
    """Grade tasks until told to stop; runs in its own session so its kernels can be killed."""
    os.setsid()
    import warnings
    warnings.filterwarnings("ignore")
    from .grading import grade
    from .submission import SubmissionError
    parent = os.getppid()
    while True:
        try:
            item = tasks.get(timeout=1)
        except queue.Empty:
            if os.getppid() != parent:  # the class run was killed: do not linger
                return
            continue
        if item is None:
            return
        student, chapter, path = item
        scratch = Path(feedback_root) / ".incoming" / f"{student}--{chapter}"
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            report = grade(Path(path), student=student, chapter=chapter if chapter in known() else None,
                           feedback_dir=scratch, private=tuple(Path(p) for p in private))
            data = report.as_json()
            data["tests"] = [dataclasses.asdict(o) for o in report.outcomes]
            data["repairs"] = report.repairs
            data["feedback_html"] = str(report.feedback_html) if report.feedback_html else None
            results.put((student, chapter, "ok", data))
        except SubmissionError as err:
            results.put((student, chapter, "ungradable", str(err)))
        except Exception as err:  # noqa: BLE001 - one line per submission, the class goes on
            first = str(err).splitlines()[0] if str(err) else ""
            results.put((student, chapter, "failed", f"grading failed: {type(err).__name__}: {first}"[:300]))


class WorkerPool:
    """N worker processes; a task that runs past its deadline has its worker killed."""

    def __init__(self, count: int, feedback_root: Path, deadline: float, private: tuple[Path, ...] = ()):
        self.ctx = multiprocessing.get_context("spawn")
        self.results = self.ctx.Queue()
        self.feedback_root, self.deadline = feedback_root, deadline
        self.private = tuple(str(p.resolve()) for p in private)
        self.workers: dict[int, dict] = {}
        for _ in range(count):
            self._start()

    def _start(self):
        tasks = self.ctx.Queue()
        proc = self.ctx.Process(target=_worker, args=(tasks, self.results, str(self.feedback_root),
                                                      self.private), daemon=True)
        proc.start()
        self.workers[proc.pid] = {"proc": proc, "tasks": tasks, "task": None, "since": 0.0}

    def idle(self):
        return [w for w in self.workers.values() if w["task"] is None]

    def submit(self, worker, task: Task):
        worker["task"], worker["since"] = task, time.monotonic()
        worker["tasks"].put((task.student, task.chapter, str(task.path)))

    def busy(self) -> bool:
        return any(w["task"] is not None for w in self.workers.values())

    def poll(self, timeout=0.5):
        """Finished results, plus synthetic failures for workers that died or overran."""
        done = []
        try:
            while True:
                student, chapter, status, data = self.results.get(timeout=timeout)
                timeout = 0
                for w in self.workers.values():
                    t = w["task"]
                    if t is not None and (t.student, t.chapter) == (student, chapter):
                        w["task"] = None
                        done.append((t, status, data))
        except queue.Empty:
            pass
        now = time.monotonic()
        for pid, w in list(self.workers.items()):
            t = w["task"]
            if t is None:
                continue
            overran = now - w["since"] > self.deadline
            if overran or not w["proc"].is_alive():
                self._kill(pid)
                reason = (f"grading did not finish within {self.deadline:g} s" if overran
                          else "the grading worker died")
                done.append((t, "failed", reason))
                self._start()
        return done

    def _kill(self, pid):
        try:
            os.killpg(pid, signal.SIGKILL)  # the worker and its kernels
        except (ProcessLookupError, PermissionError):
            pass
        w = self.workers.pop(pid)
        w["proc"].join(timeout=5)

    def close(self, kill=False):
        for pid, w in list(self.workers.items()):
            if kill or w["task"] is not None:
                self._kill(pid)
            else:
                w["tasks"].put(None)
                w["proc"].join(timeout=10)
                if w["proc"].is_alive():
                    self._kill(pid)


# ------------------------------------------------------------------ gradebook and ledger

def _hash(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


class Ledger:
    """Append-only record of finished submissions: resume, reasons, exercise scores."""

    def __init__(self, folder: Path):
        self.path = folder / ".grading" / "ledger.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def entries(self) -> dict[str, dict]:
        latest = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill: that submission is regraded
                latest[f"{entry['student']}/{entry['chapter']}"] = entry
        return latest

    def append(self, entry: dict):
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


def _points(info: ChapterInfo) -> dict[str, float]:
    import nbformat
    nb = nbformat.read(info.instructor_notebook, as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}


def ensure_gradebook(folder: Path, chapters: list[ChapterInfo]):
    """A gradebook at folder/gradebook.db that knows every chapter (generate_assignment)."""
    from nbgrader.api import Gradebook, MissingEntry
    db = f"sqlite:///{folder / 'gradebook.db'}"
    missing = []
    with Gradebook(db, COURSE_ID) as gb:
        for info in chapters:
            try:
                gb.find_assignment(info.name)
            except MissingEntry:
                missing.append(info)
    if missing:
        release(folder, missing)


def record(folder: Path, task_student: str, chapter: str, sha: str, status: str, data) -> dict:
    """Write one submission's result into the gradebook, its feedback file, and the ledger."""
    infos = known()
    info = infos.get(chapter)
    entry = {"student": task_student, "chapter": chapter, "sha256": sha, "status": status,
             "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if status == "ok":
        entry.update(score=data["score"], max_score=data["max_score"], reason="",
                     exercises={k: {"score": v["score"], "max_score": v["max_score"],
                                    "feedback": v["feedback"]} for k, v in data["exercises"].items()},
                     tests={t["test_id"]: t["score"] for t in data["tests"]}, repairs=data.get("repairs", []))
    else:
        points = _points(info) if info else {}
        entry.update(score=0.0, max_score=sum(points.values()), reason=str(data).splitlines()[0][:300],
                     exercises={}, tests={t: 0.0 for t in points}, repairs=[])
    target = folder / "feedback" / task_student / chapter / f"{chapter}.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    if status == "ok" and data.get("feedback_html") and Path(data["feedback_html"]).exists():
        shutil.move(data["feedback_html"], target)
    else:
        target.write_text(_reason_page(task_student, chapter, entry))
    _store(folder, entry)
    return entry


def _store(folder: Path, entry: dict):
    """Scores into the nbgrader gradebook (replacing an earlier grading), then the ledger."""
    from nbgrader.api import Gradebook, MissingEntry
    if entry["chapter"] in known():
        with Gradebook(f"sqlite:///{folder / 'gradebook.db'}", COURSE_ID) as gb:
            gb.update_or_create_student(entry["student"])
            try:
                gb.remove_submission(entry["chapter"], entry["student"])
            except MissingEntry:
                pass
            gb.add_submission(entry["chapter"], entry["student"])
            for test_id, score in entry["tests"].items():
                gb.find_grade(test_id, entry["chapter"], entry["chapter"], entry["student"]).auto_score = score
            gb.db.commit()
    Ledger(folder).append(entry)


def _reason_page(student, chapter, entry) -> str:
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Feedback</title></head><body>"
            f"<h1>{html.escape(chapter)}: feedback for {html.escape(student)}</h1>"
            f"<p>Score: {entry['score']:g} / {entry['max_score']:g}</p>"
            f"<p>This submission could not be graded: {html.escape(entry['reason'] or 'no reason recorded')}</p>"
            "</body></html>\n")


# ------------------------------------------------------------------ the class run

class Progress:
    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.stream = total, 0, stream
        self.started = time.monotonic()

    def step(self, n=1):
        self.done += n
        self.draw()

    def draw(self):
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed * 60
        left = (self.total - self.done) / (self.done / elapsed) if self.done else float("nan")
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        eta = f"{int(left // 60)}:{int(left % 60):02d}" if left == left else "--:--"
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                          f"{rate:5.1f}/min  left {eta} ")
        self.stream.flush()
        if self.done == self.total:
            self.stream.write("\n")


def grade_class(course: Path, chapters: list[str] | None = None, workers: int | None = None,
                force: bool = False, shard: tuple[int, int] | None = None, out: Path | None = None,
                deadline: float = 900.0, progress=True) -> dict:
    """Grade every submission under COURSE/submitted; results go to OUT (default COURSE)."""
    use_python_bin_on_path()
    out = out or course
    out.mkdir(parents=True, exist_ok=True)
    infos = known()
    tasks = [t for t in submissions(course, chapters) if in_shard(t, shard)]
    ensure_gradebook(out, [infos[c] for c in sorted({t.chapter for t in tasks}) if c in infos])
    done_before = {} if force else Ledger(out).entries()
    todo = [t for t in tasks if done_before.get(t.key, {}).get("sha256") != _hash(t.path)]
    summary = {"total": len(tasks), "skipped": len(tasks) - len(todo), "graded": 0, "failed": 0}
    bar = Progress(len(todo)) if progress and todo else None
    if todo:
        # Submitted code must not read the class's gradebook (it holds the instructor cells)
        # or other students' work.
        pool = WorkerPool(workers or os.cpu_count() or 1, out, deadline, private=(course, out))
        pending = list(todo)
        try:
            while pending or pool.busy():
                for worker in pool.idle():
                    if pending:
                        pool.submit(worker, pending.pop(0))
                for task, status, data in pool.poll():
                    entry = record(out, task.student, task.chapter, _hash(task.path), status, data)
                    summary["graded" if status == "ok" else "failed"] += 1
                    if bar:
                        bar.step()
                    if status != "ok":
                        print(f"\n{task.key}: {entry['reason']}", file=sys.stderr)
        except KeyboardInterrupt:
            pool.close(kill=True)
            print(f"\ninterrupted: {summary['graded'] + summary['failed']} of {len(todo)} recorded; "
                  "run the same command again to resume", file=sys.stderr)
            raise
        pool.close()
        shutil.rmtree(out / ".incoming", ignore_errors=True)
    export(out)
    return summary


def merge(target: Path, shards: list[Path]) -> int:
    """Combine shard results (gradebooks, feedback, ledgers) into TARGET."""
    infos = known()
    count = 0
    for shard in shards:
        entries = Ledger(shard).entries()
        ensure_gradebook(target, [infos[c] for c in sorted({e["chapter"] for e in entries.values()}) if c in infos])
        scores = _gradebook_scores(shard)
        for entry in entries.values():
            key = (entry["student"], entry["chapter"])
            if key in scores:  # the shard's gradebook is the record of its scores
                entry = {**entry, "tests": scores[key]}
            rel = Path("feedback") / entry["student"] / entry["chapter"] / f"{entry['chapter']}.html"
            if (shard / rel).exists() and (shard / rel).resolve() != (target / rel).resolve():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shard / rel, target / rel)
            _store(target, entry)
            count += 1
    export(target)
    return count


def _gradebook_scores(folder: Path) -> dict:
    from nbgrader.api import Gradebook
    scores = {}
    if not (folder / "gradebook.db").exists():
        return scores
    with Gradebook(f"sqlite:///{folder / 'gradebook.db'}", COURSE_ID) as gb:
        for assignment in gb.assignments:
            for sub in gb.assignment_submissions(assignment.name):
                tests = {}
                for nb in sub.notebooks:
                    for grade in nb.grades:
                        tests[grade.name] = grade.score
                scores[(sub.student.id, assignment.name)] = tests
    return scores


def export(folder: Path) -> tuple[Path, Path]:
    """grades.csv (a row per student, a column per chapter, total) and exercises.csv (long)."""
    from nbgrader.api import Gradebook
    entries = Ledger(folder).entries()
    chapters = sorted({e["chapter"] for e in entries.values()})
    students = sorted({e["student"] for e in entries.values()})
    totals: dict[tuple[str, str], float] = {}
    with Gradebook(f"sqlite:///{folder / 'gradebook.db'}", COURSE_ID) as gb:
        for chapter in chapters:
            try:
                subs = gb.assignment_submissions(chapter)
            except Exception:  # noqa: BLE001 - a chapter the gradebook does not know
                subs = []
            for sub in subs:
                totals[(sub.student.id, chapter)] = sub.score
    grades = folder / "grades.csv"
    with open(grades, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *chapters, "total", "notes"])
        for student in students:
            row = [totals.get((student, c), 0.0) for c in chapters]
            notes = "; ".join(f"{c}: {entries[f'{student}/{c}']['reason']}" for c in chapters
                              if entries.get(f"{student}/{c}", {}).get("reason"))
            writer.writerow([student, *[f"{s:g}" for s in row], f"{sum(row):g}", notes])
    exercises = folder / "exercises.csv"
    with open(exercises, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "chapter", "exercise", "score", "max_score", "feedback"])
        for key in sorted(entries):
            e = entries[key]
            if e["status"] != "ok":
                writer.writerow([e["student"], e["chapter"], "", 0, f"{e['max_score']:g}", e["reason"]])
                continue
            for name, ex in e["exercises"].items():
                lost = [line for line in ex["feedback"] if not line.endswith(": passed")]
                writer.writerow([e["student"], e["chapter"], name, f"{ex['score']:g}", f"{ex['max_score']:g}",
                                 " | ".join(lost)])
    return grades, exercises
