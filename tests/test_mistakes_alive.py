"""Every declared mistake model can name a mistake: on at least one probe of its test it differs
from the reference, as the judge compares them.

A mistake model that agrees with the reference on every probe it is declared on can never be
the one a submission reproduces (a submission that reproduces it passes), so its message is
dead text. In process: probes and mistake models are the judge's own (``judge.reference``).
"""
from __future__ import annotations

import types

import pytest

from autograder import chapters
from autograder.hidden import HiddenTests, Mistake
from autograder.judge import reference as R
from autograder.judge.compare import matches
from coursekit.conventions import chapter_names


def _differs(probe, index) -> bool:
    """Mistake ``index`` of the probe gives another result than the reference (raising counts:
    the judge names a mistake whose error the submission raises too)."""
    try:
        wrong = R.mistake_result(probe, index)
    except Exception:  # noqa: BLE001 - a mistake model that fails is told apart by its error
        return True
    expected = R.expected_value(probe)
    return not matches(probe, R.as_tuple(wrong) if isinstance(expected, tuple) else wrong, expected)


def _dead_mistakes(hidden) -> list[str]:
    """The chapter's mistake models that match the reference on every probe declaring them, each with
    the tests that declare it. A model is judged on all its probes: a list of mistakes shared by a
    test of shapes only, or of inputs without a mask, is alive if another test's probe tells it apart."""
    alive: dict[int, bool] = {}
    where: dict[int, tuple[str, list[str]]] = {}
    for test_id in hidden.builders:
        for probe in hidden.probes(test_id):
            if probe.raises:            # only the error is judged: the mistakes are not compared
                continue
            for index, mistake in enumerate(probe.mistakes):
                key = id(mistake)
                tests = where.setdefault(key, (mistake.message, []))[1]
                if test_id not in tests:
                    tests.append(test_id)
                if not alive.get(key):
                    alive[key] = _differs(probe, index)
    return [f"{', '.join(where[key][1])}: {where[key][0]!r}" for key, is_alive in alive.items() if not is_alive]


@pytest.mark.parametrize("name", chapter_names())
def test_every_mistake_differs_from_the_reference(name):
    """Each chapter's mistake models: none agrees with the reference on every probe that declares it."""
    dead = _dead_mistakes(chapters.ChapterInfo(name).hidden())
    assert not dead, f"{name}: mistake models equal to the reference on every probe of their tests " \
        "(a submission that reproduces one passes, so its message is never shown): " + "; ".join(dead)


def test_a_mistake_equal_to_the_reference_is_reported():
    """The check names a mistake model that only repeats the reference, with its test, and not one that differs."""
    hidden = HiddenTests(types.SimpleNamespace(double=lambda x: 2 * x))

    @hidden.test("test_double")
    def _(t):
        t.function("double", t.randn(3), mistakes=[Mistake("the reference again", lambda x: x + x),
                                                   Mistake("one too many", lambda x: 2 * x + 1)])
    assert _dead_mistakes(hidden) == ["test_double: 'the reference again'"]
