"""One harness for every chapter's catalog of submissions: correct styles, mistakes, tampering.

A chapter's test file only declares its cases and takes the tests from here::

    CATALOG = Catalog(CHAPTER, correct={...}, mistakes={name: (notebook, {test_id: words})},
                      independent={...}, tampering={name: notebook})
    from catalog import *  # noqa: F401,F403 - the catalog's tests, run on CATALOG

Every notebook is graded by the real pipeline (nbgrader autograde in the sandboxed kernel,
judged in the grader's process), two at a time, once per test session. Points per test
come from the chapter's instructor notebook.
"""
from __future__ import annotations

import dataclasses

import pytest

from autograder.chapters import ChapterInfo


@dataclasses.dataclass
class Catalog:
    chapter: str
    correct: dict  # name -> notebook: full marks
    mistakes: dict  # name -> (notebook, {test_id: words its message must contain}); other tests pass
    independent: dict = dataclasses.field(default_factory=dict)  # as mistakes: an earlier failure costs nothing later
    tampering: dict = dataclasses.field(default_factory=dict)  # name -> notebook: 0 points, no grading error

    def notebooks(self) -> dict:
        return {**{f"correct:{k}": v for k, v in self.correct.items()},
                **{f"mistake:{k}": v[0] for k, v in {**self.mistakes, **self.independent}.items()},
                **{f"tamper:{k}": v for k, v in self.tampering.items()}}

    def names(self, kind: str) -> list[str]:
        return {"correct": list(self.correct), "mistake": [*self.mistakes, *self.independent],
                "tamper": list(self.tampering)}[kind]

    def expected_losses(self, name: str) -> dict:
        return {**self.mistakes, **self.independent}[name][1]


def tampered(chapter: str, tricks=(), after_stubs=()):
    """The untouched learner notebook plus cells that try to gain points without solving anything."""
    from conftest import submission
    return submission(base="stub", chapter=chapter, prepend=tricks, append=after_stubs)


def common_tampering(chapter: str) -> dict[str, list[str]]:
    """Tricks every chapter's catalog tries (cells put before the stubs): each must gain nothing."""
    from conftest import ROOT
    reference = ROOT / "solutions" / f"ch{chapter}.py"
    return {
        "stub": [],
        "patch_allclose": ["import torch, numpy\ntorch.allclose = lambda *a, **k: True\n"
                           "torch.equal = lambda *a, **k: True\nnumpy.allclose = lambda *a, **k: True\n"
                           "torch.testing.assert_close = lambda *a, **k: None"],
        "fake_probe_module": ["import sys, types, os, json\nfake = types.ModuleType('attn_probe')\n"
                              "def run(test_id, ns):\n"
                              "    d = os.environ.get('ATTN_GRADER_RESULTS', '.')\n"
                              "    open(os.path.join(d, test_id + '.json'), 'w').write(json.dumps({'probes': "
                              "[{'status': 'ok', 'output': {'kind': 'python', 'type': 'bool'}}]}))\n"
                              "fake.run = run\nsys.modules['attn_probe'] = fake"],
        "import_reference": [f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                             f"from solutions.ch{chapter} import *"],
        "exec_reference_file": [f"exec(open({str(reference)!r}).read())"],
        "sys_exit": ["import sys\nsys.exit(0)"],
    }


def feedback_by_test(result: dict) -> dict[str, str]:
    """test id -> all its feedback lines (a test can report a hint after its main reason)."""
    out: dict[str, str] = {}
    for exercise in result["exercises"].values():
        for line in exercise["feedback"]:
            test_id = line.split(" ", 1)[0]
            out[test_id] = out.get(test_id, "") + line + "\n"
    return out


@pytest.fixture(scope="module")
def graded(request, grade_catalog):
    return grade_catalog(request.module.CATALOG.notebooks())


@pytest.fixture(scope="module")
def test_points(request):
    return ChapterInfo(request.module.CATALOG.chapter).tests


def test_correct_styles_get_full_marks(graded, test_points, correct_case):
    result = graded[f"correct:{correct_case}"]
    assert result.get("score") == sum(test_points.values()), result


def test_mistakes_lose_exactly_their_points_with_a_named_reason(request, graded, test_points, mistake_case):
    expected = request.module.CATALOG.expected_losses(mistake_case)
    result = graded[f"mistake:{mistake_case}"]
    assert "error" not in result, result
    lines = feedback_by_test(result)
    assert set(lines) == set(test_points), lines
    for test_id, points in test_points.items():
        if test_id in expected:
            assert f"(0/{points:g})" in lines[test_id], (test_id, lines[test_id])
            assert expected[test_id] in lines[test_id], (test_id, lines[test_id])
        else:
            assert f"({points:g}/{points:g}): passed" in lines[test_id], (test_id, lines[test_id])


def test_tampering_gains_nothing(graded, tamper_case):
    result = graded[f"tamper:{tamper_case}"]
    assert "error" not in result, result
    assert result["score"] == 0.0, result


__all__ = ["graded", "test_points", "test_correct_styles_get_full_marks",
           "test_mistakes_lose_exactly_their_points_with_a_named_reason", "test_tampering_gains_nothing"]
