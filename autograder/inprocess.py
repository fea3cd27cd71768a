"""A hidden test's calls run in this process, by the kernel's own routines (``sandboxed.probe``).

For the grader's tools on trusted code only (the reference and its mutants in the mutation
benchmark, the protocol tests, the in-process tier of the course's own catalogs), never for
a submission: those run in the sandboxed kernel. Each call goes the whole way the wire goes,
in memory: encoded as the grader encodes it (``session.encode_calls``), through JSON and the
``.npy`` format an ``.npz`` holds, called by ``call_all`` (``call_one`` of each probe), and its
result back the same way, decoded as the grader decodes it (``wire.decode_result``). So what
the judge reads here is what it would read from the kernel. A notebook graded here has the
session a kernel's grading has (``session.GradingSession``), on the route ``InProcessRoute``.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json
import linecache
import os
import pickle
import signal
import sys
import types

import nbformat
import numpy as np
import torch

from coursekit import conventions as C

from . import settings
from .judge import reference
from .judge.cells import judge
from .peak_memory import ThisProcess
from .report import Report
from .sandboxed import probe as kernel_side
from .sandboxed import wire
from .session import GradingSession, Route, with_model_calls
from .standins import Answerer, LocalClient
from .static_check import static_builtin_use, substituted_dependencies
from .submission import load, repaired

IN_PROCESS = "in-process"  # the stand-ins' address: answered here (``standins.LocalClient``)


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


def all_deps(probes) -> frozenset[str]:
    """Every dependency of a test's probes: those stood in for once every one's tests have run."""
    return frozenset(d for probe in probes for d in probe.deps)


class InProcessRoute(Route):
    """A test's calls made in this process by the kernel's own routines, when its cell calls
    ``attn_probe.run`` (``run`` stands in for it); given exercises and model arguments answered
    here (``standins.LocalClient``), through the same frames as across the exchange. Memory is
    read on this process around the calls alone: a visible check of the same cell may reset
    this process's counters (the chapters' ``peak_memory`` does)."""

    address = IN_PROCESS

    def __init__(self, hidden, meter=None):
        super().__init__(hidden, meter)
        self.answerer = Answerer(hidden)
        self.made: dict = {}  # (test id, dependencies substituted) -> its calls as sent, made beforehand
        self.prepared = False  # made ready for notebooks (``prepared_session``), none run yet
        self.timed_out: list[str] = []  # tests in which a call ran past its time limit
        self._inputs: dict = {}  # the test whose cell runs -> its calls as sent, and its probes
        self._results: dict = {}
        self._records: dict = {}

    def calls(self, probes, substituted, time_limit=None) -> tuple[list[dict], dict, list[str]]:
        """The calls and their arrays as the kernel reads them (encoded, then through JSON and
        the ``.npy`` format), and the dependencies stood in for."""
        calls, arrays, used = super().calls(probes, set(substituted))
        if time_limit is not None:
            for call in calls:
                call["time_limit"] = time_limit
        return json.loads(json.dumps(calls)), _through_npz(arrays), used

    def before_test(self, test_id, probes, substituted):
        made = self.made.pop((test_id, frozenset(substituted)), None)
        self._inputs[test_id] = (made or self.calls(probes, substituted), probes)

    def run(self, test_id, ns):
        """What ``attn_probe.run(test_id, globals())`` does in the kernel, for the test whose cell runs."""
        if test_id not in self._inputs:
            raise FileNotFoundError(test_id)          # the kernel finds no inputs for it
        sent, probes = self._inputs[test_id]
        with self.measured(test_id):
            self._results[test_id], self._records[test_id] = self.call(sent, probes, ns)
        kernel_side.stop_after_a_timeout(test_id, self._results[test_id], self.timed_out)

    def call(self, sent, probes, ns) -> tuple[list[dict], dict[int, list]]:
        """The results of the calls SENT of the code in ``ns``, decoded as the judge reads them,
        and the record of their model arguments' calls."""
        calls, arrays, used = sent
        self.answerer.begin(IN_PROCESS, used, probes)
        writer = wire.Writer("r")
        results = kernel_side.call_all(calls, arrays, ns, writer, connect=lambda _: LocalClient(self.answerer))
        records = self.answerer.end()
        results, back = json.loads(json.dumps(results)), _through_npz(writer.arrays)
        return [wire.decode_result(r, back) for r in results], records

    def after_test(self, test_id) -> dict[int, list]:
        self._inputs.pop(test_id, None)
        return self._records.pop(test_id, {})

    def results(self, test_id) -> list[dict] | None:
        return self._results.get(test_id)

    def close(self) -> None:
        pass


def sent_calls(probes, hidden, substituted=None, time_limit=None) -> tuple[list[dict], dict, list[str]]:
    """``InProcessRoute.calls``: the calls as the kernel reads them, and the dependencies stood in for.

    substituted: the dependencies whose reference stands in (``GradingSession.ready_deps``: those
    whose own tests have run); default every probe's ``deps``.
    """
    return InProcessRoute(hidden).calls(probes, all_deps(probes) if substituted is None else substituted,
                                        time_limit)


def run_probes(probes, ns: dict, hidden, substituted=None, time_limit=None, sent=None) -> list[dict]:
    """Results of calling the code in ``ns`` on ``probes``, decoded as the judge reads them.

    As in the kernel (``attn_probe.call_all``), a call that runs out of time ends the test: the
    calls after it are not run (the list is shorter). Given exercises and model arguments are
    stand-ins answered by the reference here, through the same frames as across the exchange.
    sent: ``sent_calls`` of the same arguments, made beforehand.
    """
    route = InProcessRoute(hidden)
    results, records = route.call(sent or sent_calls(probes, hidden, substituted, time_limit), probes, ns)
    return with_model_calls(results, probes, records)


def run_probe(probe, ns: dict, hidden, substituted=None, time_limit=None) -> dict:
    """One probe's result (``run_probes`` of one)."""
    return run_probes([probe], ns, hidden, substituted, time_limit)[0]


# ------------------------------------------------------------------ a whole notebook, in process

class KernelExit(BaseException):
    """``os._exit`` called by a notebook graded in process: as a kernel that died."""


class CellTimeout(BaseException):
    """A cell graded in process ran past the cell time limit: as the kernel's interrupt."""


def prepared_session(chapter) -> GradingSession:
    """A chapter's session before any notebook ran in it: its probes built, the reference's
    results computed (its value, then its gradients, the order the judge asks in; a mistake
    model's, which only a wrong answer needs, is left to the judge) and each test's calls made
    as the kernel reads them when every dependency's test has run. For ``grade_forked``."""
    session = in_process_session(chapter)
    for test_id, probes in session.probes.items():
        deps = all_deps(probes)
        session.route.made[test_id, deps] = session.route.calls(probes, deps)
        for probe in probes:
            for compute in (reference.reference_call, reference.expected_grads):
                try:
                    compute(probe)
                except Exception:  # noqa: BLE001 - kept on the probe: the judge meets the same error
                    pass
    session.route.prepared = True
    return session


def in_process_session(chapter) -> GradingSession:
    """A chapter's session on the route in this process, memory read on this process."""
    return GradingSession(chapter, InProcessRoute(chapter.hidden(), ThisProcess()))


_PREPARED: dict = {}  # chapter -> its prepared session, in a process that only forks graders from it


def grade_forked(paths) -> list[dict]:
    """``grade_notebook`` for each path, each in a child forked from this process, which prepares
    each chapter's session once (``prepared_session``) and never runs a notebook itself: nothing
    one notebook does reaches another or this process, and no notebook pays again for the probes
    and the reference's results. A child that dies gives ``{"error": ...}``. For the course's own
    trusted catalogs."""
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


def grade_notebook(path, prepared: GradingSession | None = None) -> dict:
    """``_grade_notebook`` with the settings read once for it."""
    with settings.in_use(settings.GraderSettings.from_environment()):
        return _grade_notebook(path, prepared)


def _grade_notebook(path, prepared: GradingSession | None = None) -> dict:
    """Grade a notebook of the course's own catalog in this process; the JSON and outcomes of ``Report.as_result``.

    The same steps as ``grading.grade`` where they do not need a kernel: the submission read and
    repaired, the test cells' hidden parts restored from the instructor notebook (as nbgrader's
    autograde does), each cell run in order (``_run_cells``), each hidden test's calls run by
    ``call_all`` and the whole judged by ``judge.cells``. No sandbox and no nbgrader: for trusted
    notebooks only, and for what does not need the real pipeline.
    """
    torch.set_num_threads(1)  # as in the grading kernel (OMP_NUM_THREADS=1): parallel workers do not fight over cores
    nb, info = load(path)
    session = _unused_session(info, prepared)
    release = nbformat.read(C.learner_notebook(info.name, info.language), as_version=4)
    # every cell the learner can edit or add, told from the release's own cells
    static = static_builtin_use(nb, session.hidden.from_scratch, release, substituted_dependencies(session),
                                kernel_only=session.hidden.kernel_only)
    clean, repairs = repaired(nb, release)
    _run_cells(_code_cells(clean, info), session)
    outcomes = judge(session, static, stopped=None)
    return Report(info.name, "student", outcomes, repairs=repairs, sandboxed=False, language=info.language,
                  written=C.written_answers(clean)).as_result()  # as the pipeline tells them (grading._graded)


def _unused_session(chapter, prepared: GradingSession | None) -> GradingSession:
    """PREPARED if it is the chapter's and no notebook ran in it yet, else a fresh session; marked used."""
    fresh = prepared is None or prepared.chapter != chapter or not prepared.route.prepared
    session = in_process_session(chapter) if fresh else prepared
    session.route.prepared = False  # one notebook per session: a second would find this one's state
    return session


def _code_cells(clean, chapter) -> list[tuple[str | None, str]]:
    """(grade id, source) of each code cell as the kernel runs it: a test cell's hidden part
    restored from the instructor notebook (as nbgrader's autograde does)."""
    instructor = nbformat.read(chapter.instructor_notebook, as_version=4)
    restored = {C.grade_id(c): c.source for c in instructor.cells if C.is_test_cell(c)}
    return [(C.grade_id(cell), _leading_empty_lines_dropped(restored.get(C.grade_id(cell), cell.source)))
            for cell in clean.cells if cell.cell_type == "code"]


def _leading_empty_lines_dropped(source: str) -> str:
    """As IPython runs a cell (its ``leading_empty_lines`` transform): line numbers in errors agree."""
    lines = source.splitlines(True)
    for i, line in enumerate(lines):
        if line and not line.isspace():
            return "".join(lines[i:])
    return source


def _run_cells(cells, session: GradingSession) -> None:
    """Each cell in order, as the kernel runs them: an error does not stop the run, ``os._exit``
    is a dead kernel (the cells after it do not run), and a cell that runs past the pipeline's
    cell time limit (the ``cell_timeout`` setting, counted in CPU seconds here, since a probe's
    own limit uses the wall-clock timer) is interrupted, as the kernel's would be."""
    ns: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    cell_limit = settings.current().cell_timeout
    with _as_in_a_kernel(session.route.run):
        for index, (grade_id, source) in enumerate(cells):
            if not _run_cell(index, grade_id, source, ns, session, cell_limit):
                break


def _run_cell(index, grade_id, source, ns, session, cell_limit) -> bool:
    """One cell, its hidden test's inputs ready while it runs (``GradingSession.before_test``);
    False if it ended the kernel."""
    filename = f"/tmp/ipykernel_0/{index}.py"     # as IPython names a cell (probe's _error_text)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    watched = session.watches(grade_id)
    if watched:
        session.before_test(grade_id)
    try:
        signal.setitimer(signal.ITIMER_VIRTUAL, cell_limit)
        exec(compile(source, filename, "exec"), ns)
    except KernelExit:
        return False
    except BaseException:  # noqa: BLE001 - an error in a cell does not stop the notebook
        pass
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        if watched:
            session.after_test(grade_id)
    return True


@contextlib.contextmanager
def _as_in_a_kernel(run):
    """While cells run here: ``attn_probe.run`` is RUN, ``os._exit`` a dead kernel (``KernelExit``),
    the cell time limit an interrupt (``CellTimeout``), and output goes nowhere."""
    probe_module = types.ModuleType("attn_probe")
    probe_module.run = run
    real_exit, saved = os._exit, sys.modules.get("attn_probe")

    def exit_kernel(code=0):
        raise KernelExit(code)

    def interrupt_cell(signum, frame):
        raise CellTimeout()
    os._exit, sys.modules["attn_probe"] = exit_kernel, probe_module
    old_handler = signal.signal(signal.SIGVTALRM, interrupt_cell)
    try:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            yield
    finally:
        signal.signal(signal.SIGVTALRM, old_handler)
        os._exit = real_exit
        if saved is None:
            sys.modules.pop("attn_probe", None)
        else:
            sys.modules["attn_probe"] = saved
