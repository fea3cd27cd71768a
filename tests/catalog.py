"""One harness for every chapter's catalog of submissions: correct styles, mistakes, tampering.

A chapter's test file only declares its cases and takes the tests from here::

    CATALOG = Catalog(CHAPTER, correct={...}, mistakes={name: (notebook, {test_id: words})},
                      independent={...}, tampering={**common_tampering(CHAPTER), name: notebook})
    from catalog import *  # noqa: F401,F403 - the catalog's tests, run on CATALOG

Two tiers (tests/conftest.py):

* every correct style and mistake is judged in process (``judged``): the kernel's own call
  routine (``attn_probe.call_one``) and the grader's own judge, without nbgrader and the sandbox;
  except a mistake whose expected message names what only a kernel shows (a time limit, a dead
  kernel: ``kernel_only``), judged through the real pipeline alone;
* every tampering case, every kernel-only mistake and a sample of the others (``sample``) go
  through the real pipeline (``graded``: nbgrader autograde in the sandboxed kernel), marked
  ``pipeline``. The sample must give the very same result both ways.

Every catalog also judges the chapter's untouched learner notebook (``Catalog.untouched``): every
test lost, each named as not implemented yet. A tampering case is that notebook plus cells
(``tampered``); the tricks every chapter could be tried with are shared (``common_tampering``).

Points per test come from the chapter's instructor notebook.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib

import pytest

from autograder.chapters import ChapterInfo


# Words of a message that only a kernel can give: a time limit, a kernel that died or was stopped.
# Emulating them in process would cost each looping case its time limits twice, and prove nothing.
KERNEL_ONLY_WORDS = ("longer than", "did not run", "did not finish")
# Words of a message the sample also sends through the pipeline, to see it given the same way there.
PIPELINE_WORDS = ("restored", "memory", "kernel")


@dataclasses.dataclass
class Catalog:
    chapter: str
    correct: dict  # name -> notebook: full marks
    mistakes: dict  # name -> (notebook, {test_id: words its message must contain}); other tests pass
    independent: dict = dataclasses.field(default_factory=dict)  # as mistakes: an earlier failure costs nothing later
    tampering: dict = dataclasses.field(default_factory=dict)  # name -> notebook: 0 points, no grading error

    @property
    def every_mistake(self) -> dict:
        """The mistakes, the independence cases and the untouched notebook: name -> (notebook, {test_id: words})."""
        return {**self.mistakes, **self.independent, **self.untouched}

    @functools.cached_property
    def disguised(self) -> dict:
        """The first mistake judged in process with comparisons patched in the kernel before it
        (``PATCHED_COMPARISONS``): name -> (notebook, the mistake's name). The judge compares
        outside the kernel, so it loses exactly what the mistake loses; on the untouched notebook
        the patch could not show anything (a stub raises before anything is compared)."""
        from coursekit.sample_submissions import insert_after_imports
        base = self.judged_mistakes()[0]
        notebook = copy.deepcopy(self.every_mistake[base][0])
        insert_after_imports(notebook, [PATCHED_COMPARISONS])
        return {"patched_comparisons": (notebook, base)}

    @functools.cached_property
    def untouched(self) -> dict:
        """The learner notebook as released: every test lost, each named as not implemented yet."""
        from support import submission
        return {"untouched_notebook": (submission(base="stub", chapter=self.chapter),
                                       {test_id: "not implemented yet" for test_id in ChapterInfo(self.chapter).tests})}

    def __post_init__(self):
        for name, (_, expected) in self.every_mistake.items():
            if not expected:
                raise ValueError(f"mistake {name}: name the tests it loses (else it only checks full marks)")
            empty = [test_id for test_id, words in expected.items() if not isinstance(words, str) or not words.strip()]
            if empty:
                raise ValueError(f"mistake {name}: give words its message must contain for {empty} "
                                 "('' is found in every message)")

    def _naming(self, words) -> list[str]:
        """Mistakes whose expected message names one of ``words``."""
        return [k for k, (_, expected) in self.every_mistake.items()
                if any(w in text for text in expected.values() for w in words)]

    def kernel_only(self) -> list[str]:
        """Mistakes whose expected message names what only a kernel shows: judged through the pipeline alone."""
        return self._naming(KERNEL_ONLY_WORDS)

    def notebooks(self) -> dict:
        return {**{f"correct:{k}": v for k, v in self.correct.items()},
                **{f"mistake:{k}": v[0] for k, v in self.every_mistake.items()},
                **{f"tamper:{k}": v for k, v in self.tampering.items()},
                **{f"disguised:{k}": v[0] for k, v in self.disguised.items()}}

    def judged_mistakes(self) -> list[str]:
        """Mistakes judged in process: all but the kernel-only ones."""
        kernel = self.kernel_only()
        return [k for k in self.every_mistake if k not in kernel]

    def names(self, kind: str) -> list[str]:
        return {"correct": list(self.correct), "mistake": self.judged_mistakes(), "kernel": self.kernel_only(),
                "tamper": list(self.tampering), "sample": self.sample(), "disguised": list(self.disguised)}[kind]

    def sample(self) -> list[str]:
        """Cases of the in-process tier also sent through the real pipeline: the first correct style,
        the first mistake, and every mistake whose message names the kernel, memory or a restored cell."""
        judged_here = self.judged_mistakes()
        named = [k for k in self._naming(PIPELINE_WORDS) if k in judged_here]
        return [f"correct:{k}" for k in list(self.correct)[:1]] + \
            [f"mistake:{k}" for k in dict.fromkeys(judged_here[:1] + named)]

    def expected_losses(self, name: str) -> dict:
        return self.every_mistake[name][1]


def with_body(chapter: str, exercise: str, name: str, body: str, extra: str = "") -> str:
    """The exercise's answer as the chapter source gives it (given code included), with the body of
    function or method ``name`` ("Class.method") replaced by ``body``; ``extra`` methods are added
    to the class. A catalog never retypes the code the chapter gives."""
    import ast
    import textwrap

    from support import reference_answers
    source = reference_answers(chapter)[exercise]
    tree = ast.parse(source)
    owner, _, method = name.rpartition(".")
    scope = tree.body
    if owner:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner).body
    node = next(n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == method)
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str) \
            and len(node.body) > 1:
        first = node.body[1]                     # the docstring stays, as a learner leaves it
    lines = source.splitlines()
    indent = " " * first.col_offset
    new = textwrap.indent(textwrap.dedent(body).strip("\n"), indent).splitlines()
    out = "\n".join(lines[:first.lineno - 1] + new + lines[node.end_lineno:]).rstrip() + "\n"
    if extra:
        out += "\n" + textwrap.indent(textwrap.dedent(extra).strip("\n"), " " * 4) + "\n"
    return out


def with_methods(chapter: str, exercise: str, methods: str, keep=("__init__",)) -> str:
    """The exercise's class as the chapter source gives it, keeping only the methods ``keep``
    (the given ones), followed by ``methods`` as a learner wrote them."""
    import ast
    import textwrap

    from support import reference_answers
    source = reference_answers(chapter)[exercise]
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == exercise)
    lines, drop = source.splitlines(), set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name not in keep:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            drop.update(range(start - 1, node.end_lineno))
    kept = "\n".join(line for i, line in enumerate(lines) if i not in drop).rstrip()
    return kept + "\n\n" + textwrap.indent(textwrap.dedent(methods).strip("\n"), " " * 4) + "\n"


def replaced(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new``: a named change of a correct body (``old`` must be there)."""
    if old not in text:
        raise ValueError(f"{old!r} is not in the body it should change")
    return text.replace(old, new)


def tampered(chapter: str, tricks=(), after_stubs=()):
    """The untouched learner notebook plus cells that try to gain points without solving anything:
    ``tricks`` right after the imports, ``after_stubs`` right after every answer cell. A hidden
    test runs right below its exercise, so a cell that would replace a stub must come before that
    test, as a learner's cell below the stub does; at the end of the notebook it would prove nothing."""
    import nbformat

    from support import reference_answers, submission
    from coursekit.conventions import grade_id
    nb = submission(base="stub", chapter=chapter, prepend=tricks)
    answers = set(reference_answers(chapter))
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if grade_id(cell) in answers:
            cells.extend(nbformat.v4.new_code_cell(source) for source in after_stubs)
    nb.cells = cells
    return nb


# Comparisons that say "equal" to anything, for whatever in the kernel would compare (``Catalog.disguised``).
PATCHED_COMPARISONS = ("import torch, numpy\ntorch.allclose = lambda *a, **k: True\n"
                       "torch.equal = lambda *a, **k: True\nnumpy.allclose = lambda *a, **k: True\n"
                       "torch.testing.assert_close = lambda *a, **k: None")


# Tricks that any chapter's notebook could try, as (cells after the imports, cells after the stubs).
# What defeats them is shared by every chapter: the judge outside the kernel, the exchange format,
# the sandbox's filesystem. A trick that would replace the stubs (by the reference's definitions)
# goes after them: before them, the stubs would undo it and it would prove nothing.
def _common_tricks(chapter: str) -> dict[str, tuple[list[str], list[str]]]:
    from support import ROOT
    module = f"solutions.ch{chapter}"
    return {
        "fake_probe_module": (["import sys, types, os, json\nfake = types.ModuleType('attn_probe')\n"
                               "def run(test_id, ns):\n"
                               "    d = os.environ.get('ATTN_GRADER_RESULTS', '.')\n"
                               "    open(os.path.join(d, test_id + '.json'), 'w').write(json.dumps({'probes': "
                               "[{'status': 'ok', 'output': {'kind': 'python', 'type': 'bool'}}]}))\n"
                               "fake.run = run\nsys.modules['attn_probe'] = fake"], []),
        "import_reference": ([], [f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom {module} import *"]),
        "exec_reference_file": ([], [f"exec(open({str(ROOT / 'solutions' / f'ch{chapter}.py')!r}).read())"]),
        "sys_exit": (["import sys\nsys.exit(0)"], []),
    }


# Chapter 2, the chapter the sandbox's own attacks are written for, tries every common trick through
# the real pipeline; each other chapter tries one, in turn, so that each trick meets at least two
# chapters. Eight chapters each trying all of them graded the same defences 35 more times (about
# 180 processor seconds of sandboxed kernels). Every chapter's untouched notebook, which each
# tampering case is built on, is judged in process (``Catalog.untouched``), and every chapter's
# tests meet patched comparisons under a real mistake (``Catalog.disguised``).
TRICKS_EVERYWHERE = "02_self_attention"


def common_tampering(chapter: str) -> dict:
    """The common tricks CHAPTER tries (``_common_tricks``), as notebooks: each must gain nothing."""
    from coursekit.conventions import chapter_names
    tricks = _common_tricks(chapter)
    if chapter != TRICKS_EVERYWHERE:
        others = [c for c in chapter_names() if c != TRICKS_EVERYWHERE]
        name = list(tricks)[others.index(chapter) % len(tricks)]
        tricks = {name: tricks[name]}
    return {name: tampered(chapter, before, after) for name, (before, after) in tricks.items()}


def feedback_by_test(result: dict) -> dict[str, str]:
    """test id -> all its feedback lines (a test can report a hint after its main reason)."""
    out: dict[str, str] = {}
    for exercise in result["exercises"].values():
        for line in exercise["feedback"]:
            test_id = line.split(" ", 1)[0]
            out[test_id] = out.get(test_id, "") + line + "\n"
    return out


def _project_digest() -> dict[str, str]:
    """Every file of the project that grading must leave alone (the grader, the course, the tests)."""
    from support import ROOT
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in ("autograder", "coursekit", "coursegen", "course", "solutions", "source", "chapters", "tests")
            for p in sorted((ROOT / folder).rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def judged(request, judge_catalog):
    """The correct styles and mistakes, judged in process (all but the kernel-only mistakes)."""
    catalog = request.module.CATALOG
    kernel = {f"mistake:{k}" for k in catalog.kernel_only()}
    return judge_catalog({k: v for k, v in catalog.notebooks().items()
                          if not k.startswith(("tamper:", "disguised:")) and k not in kernel})


@pytest.fixture(scope="module")
def graded(request, grade_catalog):
    """Tampering, the kernel-only mistakes and the sample, through the real pipeline; with the
    project's files before and after."""
    catalog = request.module.CATALOG
    before = _project_digest()
    notebooks = catalog.notebooks()
    # The kernel-only mistakes first: each of their looping cells waits out its time limit, while
    # the other worker grades the rest.
    order = [*(f"mistake:{k}" for k in catalog.kernel_only()), *catalog.sample(),
             *(k for k in notebooks if k.startswith(("tamper:", "disguised:")))]
    results = grade_catalog({k: notebooks[k] for k in order})
    return results, before


@pytest.fixture(scope="module")
def test_points(request):
    return ChapterInfo(request.module.CATALOG.chapter).tests


def check_mistake(expected: dict, result: dict, test_points: dict):
    assert "error" not in result, result
    lines = feedback_by_test(result)
    assert set(lines) == set(test_points), lines
    for test_id, points in test_points.items():
        if test_id in expected:
            assert f"(0/{points:g})" in lines[test_id], (test_id, lines[test_id])
            assert expected[test_id] in lines[test_id], (test_id, lines[test_id])
        else:
            assert f"({points:g}/{points:g}): passed" in lines[test_id], (test_id, lines[test_id])


def test_correct_styles_get_full_marks(judged, test_points, correct_case):
    result = judged[f"correct:{correct_case}"]
    assert result.get("score") == sum(test_points.values()), result


def test_mistakes_lose_exactly_their_points_with_a_named_reason(request, judged, test_points, mistake_case):
    check_mistake(request.module.CATALOG.expected_losses(mistake_case), judged[f"mistake:{mistake_case}"],
                  test_points)


def test_kernel_only_mistakes_lose_exactly_their_points_with_a_named_reason(request, graded, test_points,
                                                                           kernel_case):
    """A looping call or a dead kernel, as the sandboxed kernel meets it: only its own tests lose."""
    check_mistake(request.module.CATALOG.expected_losses(kernel_case), graded[0][f"mistake:{kernel_case}"],
                  test_points)


def test_tampering_gains_nothing(graded, tamper_case):
    result = graded[0][f"tamper:{tamper_case}"]
    assert "error" not in result, result
    assert result["score"] == 0.0, result


def test_patched_comparisons_hide_no_mistake(request, graded, test_points, disguised_case):
    """A mistake graded in a kernel whose comparisons say "equal" to anything loses what it loses alone."""
    _, base = request.module.CATALOG.disguised[disguised_case]
    check_mistake(request.module.CATALOG.expected_losses(base), graded[0][f"disguised:{disguised_case}"], test_points)


def test_the_real_pipeline_gives_the_in_process_result(graded, judged, sample_case):
    """Same scores, same feedback lines: the in-process tier judges what the kernel would return."""
    assert graded[0][sample_case] == judged[sample_case]


def test_grading_changes_no_file_of_the_project(graded):
    """After this chapter's tampering cases ran (whatever order the tests run in)."""
    before, after = graded[1], _project_digest()
    assert sorted(p for p in {*before, *after} if before.get(p) != after.get(p)) == []


__all__ = ["graded", "judged", "test_points", "test_correct_styles_get_full_marks",
           "test_mistakes_lose_exactly_their_points_with_a_named_reason",
           "test_kernel_only_mistakes_lose_exactly_their_points_with_a_named_reason", "test_tampering_gains_nothing",
           "test_patched_comparisons_hide_no_mistake",
           "test_the_real_pipeline_gives_the_in_process_result", "test_grading_changes_no_file_of_the_project"]
