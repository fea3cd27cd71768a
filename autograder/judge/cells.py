"""Judge every test cell of one submission from what its kernel returned, in the grader's process."""
from __future__ import annotations

from ..messages import from_tests, msg
from .outcome import TestOutcome, Verdict
from .verdict import verdicts


def judge(session, static: dict[str, str], stopped: str | None = None) -> list[TestOutcome]:
    """One outcome per test cell, in notebook order.

    static: exercise -> reason it earns nothing, found by reading its source.
    stopped: why the kernel was stopped early (a limit), if it was.
    """
    chapter = session.chapter
    outcomes = []
    for test_id, points in chapter.tests.items():
        exercise = chapter.exercise_of(test_id)
        found = [Verdict(static[exercise])] if exercise in static else _judge_test(session, test_id, stopped)
        outcomes.append(TestOutcome(test_id, exercise, points, 0.0 if found else points, found))
    return outcomes


def _judge_test(session, test_id, stopped) -> list[Verdict]:
    got = session.results(test_id)
    if got is None:
        if stopped:
            return [Verdict(msg("this test did not run: {why}", why=stopped))]
        return [Verdict(msg("this test did not run (the kernel died, timed out or stopped before it)"),
                        what="this test did not run")]
    probes = session.probes[test_id]
    for probe, result in zip(probes, got):
        found = verdicts(probe, result, session.hidden.from_scratch)
        if found:
            return found
    if len(got) < len(probes):
        return [Verdict(msg("this test did not finish (the kernel stopped part way): {why}", why=stopped) if stopped
                        else msg("this test did not finish (the kernel stopped part way)"),
                        what="this test did not finish")]
    return _memory_problem(session, test_id)


def _memory_problem(session, test_id) -> list[Verdict]:
    """A test with a memory rule: the kernel's peak memory, read from outside, must stay under it."""
    rule = session.hidden.memory_rules.get(test_id)
    if rule is None:
        return []
    limit, message = rule
    rise = session.memory_rise.get(test_id)
    if rise is None:
        told = msg("{rule} (the grader could not measure this test's memory)", rule=from_tests(message))
    elif rise > limit and getattr(session.kernel, "memory_measure", None) == "VmHWM":
        # No cgroup for the sandbox on this machine: only its running processes' peak resident memory
        told = msg("{rule} (the peak resident memory of the notebook's processes rose by {rise} MiB during "
                   "this test; the limit is {limit} MiB)",
                   rule=from_tests(message), rise=f"{rise / 2**20:.0f}", limit=f"{limit / 2**20:.0f}")
    elif rise > limit:
        told = msg("{rule} (memory rose by {rise} MiB during this test; the limit is {limit} MiB)",
                   rule=from_tests(message), rise=f"{rise / 2**20:.0f}", limit=f"{limit / 2**20:.0f}")
    else:
        return []
    return [Verdict(told, mistake=from_tests(message))]
