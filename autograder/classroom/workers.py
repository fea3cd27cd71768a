"""Worker processes that grade one submission at a time; one that overruns is killed with its kernels."""
from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from .. import scratch
from ..chapters import known
from .collect import Task


def _worker(tasks, results, private: tuple[str, ...], sandboxed: bool):
    """Grade tasks until told to stop; runs in its own session so its kernels can be killed.

    The next submission's kernel boots while the current one is graded (it sees nothing
    until its own submission runs in it), when the class run says one will come (``spare``:
    a kernel imports torch, seconds of processor time, and one nobody uses is waste). A file
    that is not a gradable notebook is refused before it uses up a kernel.
    """
    os.setsid()
    # A result (with its feedback page) can outgrow the pipe; if the class run was killed, nobody
    # reads it, and exiting must not wait for it to be flushed (the run's output pipes would stay open).
    results.cancel_join_thread()
    import warnings
    warnings.filterwarnings("ignore")
    from ..grading import KernelRelay, grade
    from ..submission import SubmissionError
    class_run = multiprocessing.parent_process()  # the run that started this worker (not the forkserver)
    threading.Thread(target=_stop_when_gone, args=(class_run,), daemon=True).start()
    private_paths = tuple(Path(p) for p in private)
    # the finished scratch course is kept in the results folder's .grading/ (private: no kernel reads it)
    keep_in = Path(private[-1]) / ".grading" / "work"
    keep_in.mkdir(parents=True, exist_ok=True)
    kernels = KernelRelay(sandboxed, private_paths)
    executed = _keep_executed()
    try:
        while True:
            try:
                item = tasks.get(timeout=1)
            except queue.Empty:
                if not class_run.is_alive():  # killed: a grading its interrupt did not end has ended now
                    return
                continue
            if item is None:
                return
            student, chapter, path, spare = item
            chapter_known = chapter if chapter in known() else None
            try:
                slot = kernels.take(Path(path), chapter_known, boot_next=spare)
                kept = Path(tempfile.mkdtemp(prefix="autograded-", dir=keep_in))
                try:
                    report = grade(Path(path), student=student, chapter=chapter_known, feedback=True,
                                   private=private_paths, sandboxed=sandboxed, slot=slot, keep_course=kept)
                    data = report.as_result()
                    data["repairs"] = report.repairs
                    data["feedback_page"] = report.feedback_page
                    data["autograded"] = _autograded(kept, student, report.chapter, executed.pop("notebook", None))
                finally:
                    shutil.rmtree(kept, ignore_errors=True)
                results.put((student, chapter, "ok", data))
            except SubmissionError as err:
                results.put((student, chapter, "ungradable", str(err)))
            except Exception as err:  # noqa: BLE001 - one line per submission, the class goes on
                first = str(err).splitlines()[0] if str(err) else ""
                results.put((student, chapter, "failed", f"grading failed: {type(err).__name__}: {first}"[:300]))
    except KeyboardInterrupt:  # from _stop_when_gone: a worker has its own session, no terminal's Ctrl-C
        return
    finally:
        kernels.close()
        # every kernel of this worker is shut down now: a folder an interrupt kept a grading from
        # removing is nobody's
        scratch.remove_of_process(os.getpid())


def _keep_executed() -> dict:
    """In this worker process, the autograded notebook as nbgrader's autograde wrote it, taken just
    before the feedback step rewrites it with the verdicts (feedback.render replaces every output):
    formgrader shows the instructor the notebook as it ran. (A hook in grading.py would be cleaner.)"""
    from .. import feedback
    executed: dict = {}
    render = feedback.render

    def keeping(course, chapter, student, autograded, *args, **kwargs):
        executed["notebook"] = Path(autograded).read_text(encoding="utf-8")
        return render(course, chapter, student, autograded, *args, **kwargs)
    feedback.render = keeping
    return executed


def _autograded(course: Path, student: str, chapter: str, notebook: str | None = None) -> dict:
    """What nbgrader's autograde left in the scratch COURSE for the class's gradebook and autograded/:
    the executed NOTEBOOK (else the one left there), each grade's auto score and each answer's auto
    comment, and the cells stopped at their time limit (a note: their tests may still have passed)."""
    from .gradebook import autograde_rows
    if notebook is None:
        notebook = (course / "autograded" / student / chapter / f"{chapter}.ipynb").read_text(encoding="utf-8")
    return {"notebook": notebook, **autograde_rows(course, chapter, student), "notes": interrupted_cells(notebook)}


def interrupted_cells(notebook: str) -> list[str]:
    """A note for each code cell the grader interrupted at its time limit (nbclient's interrupt ends it
    with KeyboardInterrupt; one that did not stop has CellTimeoutError)."""
    import json

    from .. import grading
    notes = []
    try:
        cells = json.loads(notebook).get("cells", [])
    except ValueError:
        return notes
    for number, cell in enumerate(cells, 1):
        names = {o.get("ename") for o in cell.get("outputs", []) if o.get("output_type") == "error"}
        if names & {"KeyboardInterrupt", "CellTimeoutError"}:
            source = "".join(cell.get("source", "")).strip().splitlines()
            first = source[0][:60] if source else ""
            notes.append(f"cell {number} ({first}) was interrupted at its time limit "
                         f"({grading.settings.current().cell_timeout:g} s)")
    return notes


def _stop_when_gone(class_run, grace: float = 60.0) -> None:
    """A worker's watch on its class run. A run that ends tells its workers; one that was killed
    (kill -9, the out-of-memory killer) cannot, and nobody would read what they grade: the grading
    under way is interrupted (its kernels shut down, its scratch folders removed, as after any
    grading; inside nbgrader's autograde, which keeps a KeyboardInterrupt to itself, the grading
    fails at once and the worker stops when idle), and if that has not ended the worker within
    GRACE seconds, its whole session is killed (a process of its own then removes its folders)."""
    class_run.join()
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # a signal, to end a blocking wait too
    time.sleep(grace)
    scratch.remove_after_exit(os.getpid())
    os.killpg(0, signal.SIGKILL)


# What grading imports (torch, nbgrader, nbconvert: seconds of processor time), imported once per
# class run by the process the workers are forked from, not once by each worker.
PRELOADED = ["torch", "nbformat", "nbgrader.apps.api", "autograder.grading", "autograder.execute",
             "autograder.feedback", "autograder.judged_grades", "autograder.report", "autograder.session",
             "autograder.template", "coursekit.nbgrader_course"]


class WorkerPool:
    """N worker processes; a task that runs past its deadline has its worker killed.

    Workers are forked from a server process that has imported the grader and never grades
    (``multiprocessing``'s forkserver): each starts in a moment, with nothing of another's.
    Each worker answers on its own queue: a worker killed while writing a result (a feedback
    page is larger than a pipe) leaves a partial message only in a queue that goes with it.
    """

    def __init__(self, count: int, deadline: float, private: tuple[Path, ...] = (), sandboxed: bool = True):
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOADED)
        self.deadline = deadline
        self.private = tuple(str(p.resolve()) for p in private)
        self.sandboxed = sandboxed
        self.workers: dict[int, dict] = {}
        for _ in range(count):
            self._start()

    def _start(self):
        tasks, results = self.ctx.Queue(), self.ctx.Queue()
        proc = self.ctx.Process(target=_worker, args=(tasks, results, self.private, self.sandboxed), daemon=True)
        proc.start()
        self.workers[proc.pid] = {"proc": proc, "tasks": tasks, "results": results, "task": None, "since": 0.0,
                                  "spare": False}

    def idle(self):
        return [w for w in self.workers.values() if w["task"] is None]

    def dispatch(self, pending: list[Task]) -> None:
        """Give each idle worker the next of PENDING (taken from the list): a worker boots a spare
        kernel only for the tasks left after all of them."""
        given = []
        for worker in self.idle():
            if not pending:
                break
            given.append((worker, pending.pop(0)))
        for worker, task in given:
            self.submit(worker, task, remaining=len(pending))

    def submit(self, worker, task: Task, remaining: int):
        """Give WORKER a task; REMAINING tasks wait after it. It boots a spare kernel for the next
        one only if the other workers' spares are too few for them."""
        spares = sum(w["spare"] for w in self.workers.values() if w is not worker)
        worker["task"], worker["since"], worker["spare"] = task, time.monotonic(), remaining > spares
        worker["tasks"].put((task.student, task.chapter, str(task.path), worker["spare"]))

    def busy(self) -> bool:
        return any(w["task"] is not None for w in self.workers.values())

    def poll(self, timeout=0.5):
        """Finished results, plus synthetic failures for workers that died or overran."""
        done = []
        until = time.monotonic() + timeout
        while True:
            for w in self.workers.values():
                try:
                    while True:
                        student, chapter, status, data = w["results"].get_nowait()
                        t = w["task"]
                        if t is not None and (t.student, t.chapter) == (student, chapter):
                            w["task"] = None
                            done.append((t, status, data))
                except queue.Empty:
                    pass
            if done or time.monotonic() >= until:
                break
            time.sleep(0.05)
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
        scratch.remove_of_process(pid)  # it could not remove its kernels' folders itself

    def close(self, kill=False):
        for pid, w in list(self.workers.items()):
            if kill or w["task"] is not None:
                self._kill(pid)
            else:
                w["tasks"].put(None)
                w["proc"].join(timeout=10)
                if w["proc"].is_alive():
                    self._kill(pid)
