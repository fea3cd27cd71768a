"""A hidden test's calls run in this process, by the kernel's own routine (``sandboxed.probe.call_one``).

For the grader's tools on trusted code only (the reference and its mutants in the mutation
benchmark, the protocol tests, the in-process tier of the course's own catalogs), never for
a submission: those run in the sandboxed kernel. Each call goes the whole way the wire goes,
in memory: encoded as the grader encodes it (``wire.encode_call``), through JSON and the
``.npy`` format an ``.npz`` holds, called by ``call_one``, and its result back the same way,
decoded as the grader decodes it (``wire.decode_result``). So what the judge reads here is
what it would read from the kernel.
"""
from __future__ import annotations

import io
import json

import numpy as np

from . import settings
from .sandboxed import probe as kernel_side
from .sandboxed import wire


def _through_npz(arrays: dict) -> dict:
    """Each array written and read back in the ``.npy`` format an ``.npz`` holds (as ``np.savez``
    writes it and ``np.load`` reads it, without the zip around them, four times faster)."""
    back = {}
    for key, value in arrays.items():
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, np.asanyarray(value), allow_pickle=False)
        buffer.seek(0)
        back[key] = np.lib.format.read_array(buffer, allow_pickle=False)
    return back


def sent_calls(probes, hidden, substituted=None, time_limit=None) -> tuple[list[dict], dict, list[str]]:
    """The calls and their arrays as the kernel reads them (encoded as ``session.encode_calls``
    encodes them, then through JSON and the ``.npy`` format), and the dependencies stood in for.

    substituted: the dependencies whose reference stands in (``GradingSession.ready_deps``: those
    whose own tests have run); default every probe's ``deps``.
    """
    from .session import encode_calls
    if substituted is None:
        substituted = {d for probe in probes for d in probe.deps}
    calls, arrays, used = encode_calls(probes, hidden, set(substituted), IN_PROCESS)
    if time_limit is not None:
        for call in calls:
            call["time_limit"] = time_limit
    return json.loads(json.dumps(calls)), _through_npz(arrays), used


IN_PROCESS = "in-process"  # the stand-ins' address: answered here (``standins.LocalClient``)


def run_probes(probes, ns: dict, hidden, substituted=None, time_limit=None, sent=None) -> list[dict]:
    """Results of calling the code in ``ns`` on ``probes``, decoded as the judge reads them.

    As in the kernel (``attn_probe.run``), a call that runs out of time ends the test: the
    calls after it are not run (the list is shorter). Given exercises and model arguments are
    stand-ins answered by the reference here, through the same frames as across the exchange.
    sent: ``sent_calls`` of the same arguments, made beforehand.
    """
    from .session import with_model_calls
    from .standins import Answerer, LocalClient
    calls, arrays, used = sent or sent_calls(probes, hidden, substituted, time_limit)
    answerer = Answerer(hidden)
    answerer.begin(IN_PROCESS, used, probes)
    writer, results = wire.Writer("r"), []
    for call in calls:
        outcome = kernel_side.call_one(call, arrays, ns, writer, connect=lambda _: LocalClient(answerer))
        results.append(outcome)
        if outcome["status"] == "timeout":
            break
    records = answerer.end()
    results, back = json.loads(json.dumps(results)), _through_npz(writer.arrays)
    return with_model_calls([wire.decode_result(r, back) for r in results], probes, records)


def run_probe(probe, ns: dict, hidden, substituted=None, time_limit=None) -> dict:
    """One probe's result (``run_probes`` of one)."""
    return run_probes([probe], ns, hidden, substituted, time_limit)[0]


# ------------------------------------------------------------------ a whole notebook, in process

class KernelExit(BaseException):
    """``os._exit`` called by a notebook graded in process: as a kernel that died."""


class CellTimeout(BaseException):
    """A cell graded in process ran past the cell time limit: as the kernel's interrupt."""


class _OwnMemory:
    """The kernel manager's memory rule readings (``GradingKernelManager``), on this process."""

    def reset_peak_memory(self) -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self._before = _status("VmRSS")

    def peak_memory_rise(self) -> int | None:
        peak, before = _status("VmHWM"), getattr(self, "_before", None)
        return None if before is None or not peak else max(peak - before, 0)


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":")), 0)


class _Session:
    """``GradingSession`` without an exchange: a test's calls run here, by ``call_one``, when its cell does."""

    def __init__(self, chapter):
        from .session import GradingSession
        self.chapter, self.kernel = chapter, _OwnMemory()
        self.hidden = chapter.hidden()
        self.test_order = list(chapter.tests)
        self.probes = {t: self.hidden.probes(t) for t in self.test_order}
        self.prepared = False
        self.sent: dict = {}  # (test id, dependencies substituted) -> its sent_calls, made beforehand
        self.completed: set[str] = set()
        self.timed_out: list[str] = []  # tests in which a call ran past its time limit
        self.memory_rise: dict = {}
        self._results: dict = {}
        self._deps_ready = lambda dep: GradingSession._deps_ready(self, dep)
        self.ready_deps = lambda test_id: GradingSession.ready_deps(self, test_id)

    def run(self, test_id, ns):
        """What ``attn_probe.run(test_id, globals())`` does in the kernel; kept for the judge."""
        if test_id not in self.probes or test_id in self.completed:
            raise FileNotFoundError(test_id)          # the kernel finds no inputs for it
        ready = set(self.ready_deps(test_id))
        measured = test_id in self.hidden.memory_rules
        if measured:
            self.kernel.reset_peak_memory()
        try:
            sent = self.sent.pop((test_id, frozenset(ready)), None)
            self._results[test_id] = run_probes(self.probes[test_id], ns, self.hidden, substituted=ready, sent=sent)
        finally:
            if measured:
                self.memory_rise[test_id] = self.kernel.peak_memory_rise()
        if any(r["status"] == "timeout" for r in self._results[test_id]):
            self.timed_out.append(test_id)
        if self.timed_out:  # as the kernel: the visible checks of this test and later ones are skipped
            raise SystemExit("a call ran past its time limit")

    def results(self, test_id):
        return self._results.get(test_id)


def prepared_session(chapter) -> _Session:
    """A chapter's session before any notebook ran in it: its probes built, the reference's
    results computed (its value, then its gradients, the order the judge asks in; a mistake
    model's, which only a wrong answer needs, is left to the judge) and each test's calls made
    as the kernel reads them when every dependency's test has run. For ``grade_forked``."""
    from .judge import reference
    session = _Session(chapter)
    for test_id, probes in session.probes.items():
        deps = frozenset(d for probe in probes for d in probe.deps)
        session.sent[test_id, deps] = sent_calls(probes, session.hidden, substituted=deps)
        for probe in probes:
            for compute in (reference.reference_call, reference.expected_grads):
                try:
                    compute(probe)
                except Exception:  # noqa: BLE001 - kept on the probe: the judge meets the same error
                    pass
    session.prepared = True
    return session


_PREPARED: dict = {}  # chapter -> its prepared session, in a process that only forks graders from it


def grade_forked(paths) -> list[dict]:
    """``grade_notebook`` for each path, each in a child forked from this process, which prepares
    each chapter's session once (``prepared_session``) and never runs a notebook itself: nothing
    one notebook does reaches another or this process, and no notebook pays again for the probes
    and the reference's results. A child that dies gives ``{"error": ...}``. For the course's own
    trusted catalogs."""
    import torch
    from .submission import load
    torch.set_num_threads(1)  # before any work: a child must not inherit a parent's thread pool
    results = []
    for path in paths:
        try:
            chapter = load(path)[1]
            if chapter not in _PREPARED:
                _PREPARED[chapter] = prepared_session(chapter)
            session = _PREPARED[chapter]
        except Exception:  # noqa: BLE001 - the child meets the same error and reports it
            session = None
        results.append(_in_a_child(grade_notebook, path, session))
    return results


def _in_a_child(function, *args):
    """``function(*args)`` in a forked child; its result (pickled through a pipe) or ``{"error": ...}``."""
    import gc
    import os
    import pickle
    gc.freeze()  # what this process holds is not the child's garbage: its collections skip it (as a fresh kernel's would)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        try:
            result = function(*args)
        except BaseException as err:  # noqa: BLE001
            result = {"error": f"{type(err).__name__}: {err}"}
        with os.fdopen(write, "wb") as out:
            pickle.dump(result, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as back:
        data = back.read()
    _, status = os.waitpid(pid, 0)
    return pickle.loads(data) if data else {"error": f"the process grading it ended with status {status}"}


def _leading_empty_lines_dropped(source: str) -> str:
    """As IPython runs a cell (its ``leading_empty_lines`` transform): line numbers in errors agree."""
    lines = source.splitlines(True)
    for i, line in enumerate(lines):
        if line and not line.isspace():
            return "".join(lines[i:])
    return source


def grade_notebook(path, prepared: _Session | None = None) -> dict:
    """``_grade_notebook`` with the settings read once for it."""
    with settings.in_use(settings.GraderSettings.from_environment()):
        return _grade_notebook(path, prepared)


def _grade_notebook(path, prepared: _Session | None = None) -> dict:
    """Grade a notebook of the course's own catalog in this process; the grader's JSON (``Report.as_json``).

    The same steps as ``grading.grade`` where they do not need a kernel: the submission read and
    repaired, the test cells' hidden parts restored from the instructor notebook (as nbgrader's
    autograde does), each cell run in order (errors do not stop the run; ``os._exit`` is a dead
    kernel: the cells after it do not run), each hidden test's calls run by ``call_one`` and the
    whole judged by ``judge.cells``. No sandbox and no nbgrader: for trusted notebooks only, and for
    what does not need the real pipeline. A cell that runs past the pipeline's cell time limit
    (the ``cell_timeout`` setting, counted in CPU seconds here, since a probe's own limit uses the
    wall-clock timer) is interrupted, as the kernel's would be.
    """
    import contextlib
    import linecache
    import os
    import signal
    import sys
    import types

    import nbformat

    from coursekit import conventions as C

    from .judge.cells import judge
    from .report import Report
    from .static_check import static_builtin_use, substituted_dependencies
    from .submission import load, repaired

    import torch
    torch.set_num_threads(1)  # as in the grading kernel (OMP_NUM_THREADS=1): parallel workers do not fight over cores

    nb, info = load(path)
    fresh = prepared is None or prepared.chapter != info or not prepared.prepared
    session = _Session(info) if fresh else prepared
    session.prepared = False  # one notebook per session: a second would find this one's state
    release = nbformat.read(C.learner_notebook(info.name, info.language), as_version=4)
    # every cell the learner can edit or add, told from the release's own cells
    static = static_builtin_use(nb, session.hidden.from_scratch, release, substituted_dependencies(session))
    clean, repairs = repaired(nb, release)
    instructor = nbformat.read(info.instructor_notebook, as_version=4)
    restored = {C.grade_id(c): c.source for c in instructor.cells if C.is_test_cell(c)}
    ns: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    probe_module = types.ModuleType("attn_probe")
    probe_module.run = session.run
    real_exit, saved = os._exit, sys.modules.get("attn_probe")

    def exit_kernel(code=0):
        raise KernelExit(code)
    os._exit, sys.modules["attn_probe"] = exit_kernel, probe_module
    cell_limit = settings.current().cell_timeout

    def interrupt_cell(signum, frame):
        raise CellTimeout()
    old_handler = signal.signal(signal.SIGVTALRM, interrupt_cell)
    try:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            for index, cell in enumerate(c for c in clean.cells if c.cell_type == "code"):
                source = _leading_empty_lines_dropped(restored.get(C.grade_id(cell), cell.source))
                filename = f"/tmp/ipykernel_0/{index}.py"     # as IPython names a cell (probe's _error_text)
                linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
                grade_id = C.grade_id(cell)
                try:
                    signal.setitimer(signal.ITIMER_VIRTUAL, cell_limit)
                    exec(compile(source, filename, "exec"), ns)
                except KernelExit:
                    break
                except BaseException:  # noqa: BLE001 - an error in a cell does not stop the notebook
                    pass
                finally:
                    signal.setitimer(signal.ITIMER_VIRTUAL, 0)
                    if grade_id in session.probes:
                        session.completed.add(grade_id)
    finally:
        signal.signal(signal.SIGVTALRM, old_handler)
        os._exit = real_exit
        if saved is None:
            sys.modules.pop("attn_probe", None)
        else:
            sys.modules["attn_probe"] = saved
    outcomes = judge(session, static, stopped=None)
    return Report(info.name, "student", outcomes, repairs=repairs, sandboxed=False, language=info.language,
                  written=C.written_answers(clean)).as_json()  # as the pipeline tells them (grading._graded)
