"""One submission's hidden tests while its kernel runs: which test's inputs exist when.

Before a hidden test cell runs, its inputs (and nothing else) are written to the
exchange folder; right after, its results are taken out of the kernel's reach and the
folder is emptied. Code in earlier cells never sees later inputs, and a test's results
can only come from that test's own run.
"""
from __future__ import annotations

from pathlib import Path

from . import standins, transfer
from .sandboxed import wire
from .chapters import ChapterInfo
from .exchange import Exchange

STANDIN_SOCKET = "standin.sock"  # in the exchange folder: where the kernel calls given exercises


class GradingSession:
    def __init__(self, chapter: ChapterInfo, exchange: Exchange, private: Path, kernel=None):
        self.chapter, self.exchange, self.private, self.kernel = chapter, exchange, private, kernel
        private.mkdir(parents=True, exist_ok=True)
        self.hidden = chapter.hidden()
        self.test_order = list(chapter.tests)
        self.probes = {t: self.hidden.probes(t) for t in self.test_order}
        self.completed: set[str] = set()
        self.memory_rise: dict[str, int | None] = {}  # test id -> bytes, for tests with a memory rule
        socket_path = exchange.folder / STANDIN_SOCKET
        self.standin_address = (exchange.inside(socket_path) if kernel is None or kernel.sandboxed
                                else str(socket_path))
        self.standins = standins.StandInService(self.hidden, socket_path)
        self.model_calls: dict[str, dict[int, list]] = {}  # test id -> probe -> the grader's record

    def watches(self, grade_id) -> bool:
        return grade_id in self.probes and grade_id not in self.completed

    def before_test(self, test_id):
        self.exchange.clear()
        calls, arrays, ready = encode_calls(self.probes[test_id], self.hidden, self.ready_deps(test_id),
                                            self.standin_address)
        if ready or any(c["standins"] for c in calls):
            self.standins.begin(test_id, ready)
        transfer.write_inputs(self.exchange.cases, test_id, calls, arrays)
        if test_id in self.hidden.memory_rules and self.kernel is not None:
            self.kernel.reset_peak_memory()

    def after_test(self, test_id):
        if test_id in self.hidden.memory_rules and self.kernel is not None:
            self.memory_rise[test_id] = self.kernel.peak_memory_rise()
        self.model_calls[test_id] = self.standins.end()
        transfer.take_results(self.exchange, self.private, test_id)
        self.exchange.clear()
        self.completed.add(test_id)

    def results(self, test_id) -> list[dict] | None:
        return with_model_calls(transfer.read_results(self.private, test_id), self.probes[test_id],
                                self.model_calls.get(test_id, {}))

    def close(self) -> None:
        self.standins.close()

    def _deps_ready(self, dep) -> bool:
        """Substitute the reference for a dependency only once its own tests have all run."""
        return all(t in self.completed for t in self.test_order if self.chapter.exercise_of(t) == dep)

    def ready_deps(self, test_id) -> list[str]:
        """The test's dependencies whose own tests have all run: the reference stands in for them."""
        return sorted({d for probe in self.probes[test_id] for d in probe.deps if self._deps_ready(d)})


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
