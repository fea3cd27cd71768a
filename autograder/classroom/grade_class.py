"""Grade every submission of a class in parallel worker processes; only this process writes results."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

from ..chapters import known
from ..sandbox import bubblewrap
from . import class_report
from .collect import in_shard, submissions
from .export import export
from .folders import class_folder
from .late import copy_settings
from .ledger import FORCED, Ledger, file_hash, forced_since, version
from .progress import Progress
from .record import ensure_gradebook, record, submitted_timestamp
from .workers import WorkerPool


def grade_class(course: Path, chapters: list[str] | None = None, workers: int | None = None,
                force: bool = False, shard: tuple[int, int] | None = None, out: Path | None = None,
                deadline: float = 900.0, progress=True, sandboxed: bool = True) -> dict:
    """Grade every submission under COURSE/submitted; results go to OUT (default COURSE)."""
    if sandboxed:
        bubblewrap()  # one line now, rather than the same failure for every submission
    started = time.time()
    course = class_folder(course)
    out = class_folder(out, "--out") if out else course
    out.mkdir(parents=True, exist_ok=True)
    infos = known()
    tasks = [t for t in submissions(course, chapters) if in_shard(t, shard)]
    ensure_gradebook(out, [infos[c] for c in sorted({t.chapter for t in tasks}) if c in infos])
    if out != course:  # a shard's results folder: the course's due dates and late policy
        copy_settings(course, out, {t.chapter for t in tasks})
    ledger = Ledger(out)
    since = forced_since(out)  # a --force run that was interrupted: what it recorded stands
    if force and since is None:
        since = ledger.lines()
        (out / FORCED).write_text(json.dumps({"line": since, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}))
    done_before = ledger.entries(since or 0)
    versions = {c: version(c, out) for c in {t.chapter for t in tasks}}

    def done(t) -> bool:  # the same file, timestamp and grader and chapter version as recorded
        e = done_before.get(t.key, {})
        return (e.get("sha256") == file_hash(t.path) and e.get("version") == versions[t.chapter]
                and e.get("timestamp") == submitted_timestamp(t.path))
    todo = [t for t in tasks if not done(t)]
    summary = {"total": len(tasks), "skipped": len(tasks) - len(todo), "graded": 0, "failed": 0}
    bar = Progress(len(todo)) if progress and todo else None
    if todo:
        # Submitted code must not read the class's gradebook (it holds the instructor cells)
        # or other students' work.
        count = min(workers or os.cpu_count() or 1, len(todo))  # a worker imports the grader: none idle
        pool = WorkerPool(count, deadline, private=(course, out), sandboxed=sandboxed)
        pending = list(todo)
        try:
            while pending or pool.busy():
                pool.dispatch(pending)
                for task, status, data in pool.poll():
                    entry = record(out, task.student, task.chapter, file_hash(task.path), status, data, task.path,
                                   versions[task.chapter])
                    summary["graded" if status == "ok" else "failed"] += 1
                    if bar:
                        bar.step()
                    if status != "ok":
                        print(f"\n{task.key}: {entry['reason']}", file=sys.stderr)
        except KeyboardInterrupt:
            pool.close(kill=True)
            summary["interrupted"] = True
            class_report.record_run(out, started, summary, workers or os.cpu_count() or 1, shard)
            kept = " (what this --force run recorded is kept: the rest is graded again)" if since is not None else ""
            print(f"\ninterrupted: {summary['graded'] + summary['failed']} of {len(todo)} recorded; "
                  f"run the same command again to resume{kept}", file=sys.stderr)
            raise
        finally:
            shutil.rmtree(out / ".grading" / "work", ignore_errors=True)
        pool.close()
    (out / FORCED).unlink(missing_ok=True)  # finished: a later run skips by file and version again
    export(out)
    class_report.record_run(out, started, summary, workers or os.cpu_count() or 1, shard)
    class_report.write(out, course / "submitted")
    return summary
