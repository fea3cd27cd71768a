"""One submission's hidden tests while its notebook runs: which test's inputs exist when.

Before a hidden test cell runs, its inputs (and nothing else) are made ready for it; right
after, its results are taken out of the submission's reach. Code in earlier cells never sees
later inputs, and a test's results can only come from that test's own run. One session,
``GradingSession``, keeps this order for either route a test's calls take:

* ``KernelRoute``: through the exchange folder to the sandboxed kernel, whose ``attn_probe.run``
  calls the submission (``grading``);
* ``inprocess.InProcessRoute``: in the grader's tools' own process, by the same kernel-side
  routines (``inprocess.grade_notebook``, for trusted notebooks only).
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from . import standins, transfer
from .sandboxed import wire
from .chapters import ChapterInfo
from .exchange import Exchange

STANDIN_SOCKET = "standin.sock"  # in the exchange folder: where the kernel calls given exercises


class GradingSession:
    """A chapter's hidden tests for one submission, whichever route carries their calls: what
    the judge reads (``probes``, ``results``, ``memory_rise``, ``kernel``) and what the notebook's
    run calls around each hidden test cell (``watches``, ``before_test``, ``after_test``)."""

    def __init__(self, chapter: ChapterInfo, route: "Route"):
        self.chapter, self.route = chapter, route
        self.hidden = route.hidden
        self.kernel = route.meter  # what measured memory (the judge asks it how)
        self.memory_rise = route.memory_rise  # test id -> bytes, for tests with a memory rule
        self.test_order = list(chapter.tests)
        self.probes = {t: self.hidden.probes(t) for t in self.test_order}
        self.completed: set[str] = set()
        self.model_calls: dict[str, dict[int, list]] = {}  # test id -> probe -> the grader's record
        route.open()  # after the probes are built: a stand-in process forked now answers with these

    @classmethod
    def in_kernel(cls, chapter: ChapterInfo, exchange: Exchange, private: Path, kernel=None) -> "GradingSession":
        """The session of a grading in the sandboxed kernel (``KernelRoute``)."""
        sandboxed = kernel is None or kernel.sandboxed
        return cls(chapter, KernelRoute(chapter.hidden(), exchange, private, kernel, sandboxed))

    def watches(self, grade_id) -> bool:
        return grade_id in self.probes and grade_id not in self.completed

    def before_test(self, test_id):
        self.route.before_test(test_id, self.probes[test_id], self.ready_deps(test_id))

    def after_test(self, test_id):
        self.model_calls[test_id] = self.route.after_test(test_id)
        self.completed.add(test_id)

    def results(self, test_id) -> list[dict] | None:
        return with_model_calls(self.route.results(test_id), self.probes[test_id],
                                self.model_calls.get(test_id, {}))

    def close(self) -> None:
        self.route.close()

    def _deps_ready(self, dep) -> bool:
        """Substitute the reference for a dependency only once its own tests have all run."""
        return all(t in self.completed for t in self.test_order if self.chapter.exercise_of(t) == dep)

    def ready_deps(self, test_id) -> list[str]:
        """The test's dependencies whose own tests have all run: the reference stands in for them."""
        return sorted({d for probe in self.probes[test_id] for d in probe.deps if self._deps_ready(d)})


class Route:
    """What both routes share: a test's calls encoded for the stand-ins' ``address``, and the
    memory of a test with a memory rule, read by ``meter`` (``reset_peak_memory``,
    ``peak_memory_rise``; None: not measured)."""

    address: str

    def __init__(self, hidden, meter=None):
        self.hidden, self.meter = hidden, meter
        self.memory_rise: dict[str, int | None] = {}

    def open(self) -> None:
        """Ready to carry calls (the session's probes are built)."""

    def calls(self, probes, substituted) -> tuple[list[dict], dict, list[str]]:
        return encode_calls(probes, self.hidden, substituted, self.address)

    def start_measuring(self, test_id) -> None:
        if test_id in self.hidden.memory_rules and self.meter is not None:
            self.meter.reset_peak_memory()

    def stop_measuring(self, test_id) -> None:
        """The memory rise since ``start_measuring``, kept for a test with a memory rule."""
        if test_id in self.hidden.memory_rules and self.meter is not None:
            self.memory_rise[test_id] = self.meter.peak_memory_rise()

    @contextlib.contextmanager
    def measured(self, test_id):
        self.start_measuring(test_id)
        try:
            yield
        finally:
            self.stop_measuring(test_id)


class KernelRoute(Route):
    """A test's calls through the exchange folder to the kernel, whose ``attn_probe.run`` makes
    them; given exercises and model arguments answered by the stand-in process behind the
    exchange's socket. Memory is read from outside, around the whole cell (``meter``: the
    ``GradingKernelManager``). sandboxed: the kernel reaches the socket at its path inside the sandbox."""

    def __init__(self, hidden, exchange: Exchange, private: Path, meter=None, sandboxed: bool = True):
        super().__init__(hidden, meter)
        self.exchange, self.private = exchange, private
        private.mkdir(parents=True, exist_ok=True)
        self.socket_path = exchange.folder / STANDIN_SOCKET
        self.address = exchange.inside(self.socket_path) if sandboxed else str(self.socket_path)
        self.standins = None

    def open(self) -> None:
        self.standins = standins.StandInService(self.hidden, self.socket_path)

    def before_test(self, test_id, probes, substituted):
        self.exchange.clear()
        calls, arrays, used = self.calls(probes, substituted)
        if used or any(c["standins"] for c in calls):
            self.standins.begin(test_id, used)
        transfer.write_inputs(self.exchange.cases, test_id, calls, arrays)
        self.start_measuring(test_id)

    def after_test(self, test_id) -> dict[int, list]:
        """Ends the test: its results out of the kernel's reach; the grader's record of its model
        arguments' calls."""
        self.stop_measuring(test_id)
        records = self.standins.end()
        transfer.take_results(self.exchange, self.private, test_id)
        self.exchange.clear()
        return records

    def results(self, test_id) -> list[dict] | None:
        return transfer.read_results(self.private, test_id)

    def close(self) -> None:
        if self.standins is not None:
            self.standins.close()


def encode_calls(probes, hidden, substituted, address) -> tuple[list[dict], dict, list[str]]:
    """A test's calls (and their arrays) as the kernel reads them, with the dependencies in
    ``substituted`` stood in for across the exchange (``standins``); and those dependencies."""
    arrays: dict = {}
    calls, used = [], set()
    for index, probe in enumerate(probes):
        names = [d for d in probe.deps if d in substituted]
        used |= set(names)
        deps = {"names": names, "given": standins.given(hidden.reference, names)} if names else {}
        calls.append(wire.encode_call(index, probe, deps, arrays, standins.describe, address))
    return calls, arrays, sorted(used)


def with_model_calls(results, probes, records) -> list[dict] | None:
    """The results, each probe with model arguments carrying the grader's record of their calls
    (whatever the kernel wrote in its place)."""
    if results is None:
        return None
    out = []
    for index, (result, probe) in enumerate(zip(results, probes)):
        result = dict(result)
        result.pop("model_calls", None)
        if any(isinstance(v, wire.ModelArg) for v in standins.values_in([*probe.args, *probe.kwargs.values()])):
            result["model_calls"] = records.get(index, [])
        out.append(result)
    return out + list(results[len(out):])
