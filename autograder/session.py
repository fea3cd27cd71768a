"""One submission's hidden tests while its kernel runs: which test's inputs exist when.

Before a hidden test cell runs, its inputs (and nothing else) are written to the
exchange folder; right after, its results are taken out of the kernel's reach and the
folder is emptied. Code in earlier cells never sees later inputs, and a test's results
can only come from that test's own run.
"""
from __future__ import annotations

from pathlib import Path

from . import transfer
from .sandboxed import wire
from .chapters import ChapterInfo
from .exchange import Exchange


class GradingSession:
    def __init__(self, chapter: ChapterInfo, exchange: Exchange, private: Path, kernel=None):
        self.chapter, self.exchange, self.private, self.kernel = chapter, exchange, private, kernel
        private.mkdir(parents=True, exist_ok=True)
        self.hidden = chapter.hidden()
        self.test_order = list(chapter.tests)
        self.probes = {t: self.hidden.probes(t) for t in self.test_order}
        self.completed: set[str] = set()
        self.memory_rise: dict[str, int | None] = {}  # test id -> bytes, for tests with a memory rule

    def watches(self, grade_id) -> bool:
        return grade_id in self.probes and grade_id not in self.completed

    def before_test(self, test_id):
        self.exchange.clear()
        arrays: dict = {}
        calls = [wire.encode_call(i, probe, self._deps(probe), arrays, self.hidden.model_source)
                 for i, probe in enumerate(self.probes[test_id])]
        transfer.write_inputs(self.exchange.cases, test_id, calls, arrays)
        if test_id in self.hidden.memory_rules and self.kernel is not None:
            self.kernel.reset_peak_memory()

    def after_test(self, test_id):
        if test_id in self.hidden.memory_rules and self.kernel is not None:
            self.memory_rise[test_id] = self.kernel.peak_memory_rise()
        transfer.take_results(self.exchange, self.private, test_id)
        self.exchange.clear()
        self.completed.add(test_id)

    def results(self, test_id) -> list[dict] | None:
        return transfer.read_results(self.private, test_id)

    def _deps_ready(self, dep) -> bool:
        """Substitute the reference for a dependency only once its own tests have all run."""
        return all(t in self.completed for t in self.test_order if self.chapter.exercise_of(t) == dep)

    def _deps(self, probe) -> dict:
        ready = [d for d in probe.deps if self._deps_ready(d)]
        return {"names": ready, "source": self.hidden.dependency_source(ready)} if ready else {}
