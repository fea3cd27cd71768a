"""Grade every submission of a class in parallel worker processes; only this process writes results."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..chapters import known
from ..sandbox import bubblewrap
from . import class_report
from .collect import in_shard, submissions
from .export import export
from .folders import class_folder
from .ledger import Ledger, file_hash
from .progress import Progress
from .record import ensure_gradebook, record
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
    done_before = {} if force else Ledger(out).entries()
    todo = [t for t in tasks if done_before.get(t.key, {}).get("sha256") != file_hash(t.path)]
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
                    entry = record(out, task.student, task.chapter, file_hash(task.path), status, data, task.path)
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
    export(out)
    class_report.record_run(out, started, summary, workers or os.cpu_count() or 1, shard)
    class_report.write(out, course / "submitted")
    return summary
