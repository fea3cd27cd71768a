"""One harness for every chapter's catalog of submissions: correct styles, mistakes, tampering.

A chapter's test file only declares its cases and takes the tests from here::

    CATALOG = Catalog(CHAPTER, correct={...}, mistakes={name: (notebook, {test_id: words})},
                      independent={...}, tampering={**common_tampering(CHAPTER), name: notebook},
                      kernel_only={name, ...}, sampled={name, ...})

    class TestCatalog(CatalogTests):
        catalog = CATALOG

pytest collects the methods of ``CatalogTests`` by its own rules (a new ``test_`` method runs
without being listed anywhere).

Two tiers (tests/conftest.py):

* every correct style and mistake is judged in process (``judged``): the kernel's own call
  routine (``attn_probe.call_one``) and the grader's own judge, without nbgrader and the sandbox;
  except the mistakes flagged ``kernel_only`` (a time limit, a dead kernel: what only a kernel
  shows), judged through the real pipeline alone;
* every tampering case, every kernel-only mistake and a sample of the others (``sample``: the
  first correct style, the first judged mistake and the mistakes flagged ``sampled``) go
  through the real pipeline (``graded``: nbgrader autograde in the sandboxed kernel), marked
  ``pipeline``. The sample must give the very same result both ways.

Every catalog also judges the chapter's untouched learner notebook (``Catalog.untouched``): every
test lost, each named as not implemented yet. A tampering case is that notebook plus cells
(``tampered``); the tricks every chapter could be tried with are shared (``common_tampering``).

Test ids and points per test come from the chapter (``ChapterInfo``: its instructor notebook).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib

import pytest

from autograder.chapters import ChapterInfo


@dataclasses.dataclass
class Catalog:
    chapter: str
    correct: dict  # name -> notebook: full marks
    mistakes: dict  # name -> (notebook, {test_id: words its message must contain}); other tests pass
    independent: dict = dataclasses.field(default_factory=dict)  # as mistakes: an earlier failure costs nothing later
    tampering: dict = dataclasses.field(default_factory=dict)  # name -> notebook: 0 points, no grading error
    # Mistakes only a kernel shows (a time limit, a dead kernel): judged through the pipeline alone.
    # Emulating them in process would cost each looping case its time limits twice, and prove nothing.
    kernel_only: set = dataclasses.field(default_factory=set)
    # Mistakes judged in process also sent through the pipeline, to see them given the same way there
    # (a message about the kernel, memory or a restored cell).
    sampled: set = dataclasses.field(default_factory=set)

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
        self.kernel_only, self.sampled = set(self.kernel_only), set(self.sampled)
        unknown = (self.kernel_only | self.sampled) - set(self.every_mistake)
        if unknown:
            raise ValueError(f"flagged cases {sorted(unknown)} are not mistakes of the catalog")
        if self.kernel_only & self.sampled:
            raise ValueError(f"{sorted(self.kernel_only & self.sampled)}: a kernel-only mistake is not judged "
                             "in process, so it cannot be sampled")
        for name, (_, expected) in self.every_mistake.items():
            if not expected:
                raise ValueError(f"mistake {name}: name the tests it loses (else it only checks full marks)")
            empty = [test_id for test_id, words in expected.items() if not isinstance(words, str) or not words.strip()]
            if empty:
                raise ValueError(f"mistake {name}: give words its message must contain for {empty} "
                                 "('' is found in every message)")

    def kernel_mistakes(self) -> list[str]:
        """The mistakes flagged ``kernel_only``, in catalog order: judged through the pipeline alone."""
        return [k for k in self.every_mistake if k in self.kernel_only]

    def notebooks(self) -> dict:
        return {**{f"correct:{k}": v for k, v in self.correct.items()},
                **{f"mistake:{k}": v[0] for k, v in self.every_mistake.items()},
                **{f"tamper:{k}": v for k, v in self.tampering.items()},
                **{f"disguised:{k}": v[0] for k, v in self.disguised.items()}}

    def judged_mistakes(self) -> list[str]:
        """Mistakes judged in process: all but the kernel-only ones."""
        return [k for k in self.every_mistake if k not in self.kernel_only]

    def names(self, kind: str) -> list[str]:
        return {"correct": list(self.correct), "mistake": self.judged_mistakes(), "kernel": self.kernel_mistakes(),
                "tamper": list(self.tampering), "sample": self.sample(), "disguised": list(self.disguised)}[kind]

    def sample(self) -> list[str]:
        """Cases of the in-process tier also sent through the real pipeline: the first correct style,
        the first judged mistake, and every mistake flagged ``sampled``."""
        judged_here = self.judged_mistakes()
        flagged = [k for k in judged_here if k in self.sampled]
        return [f"correct:{k}" for k in list(self.correct)[:1]] + \
            [f"mistake:{k}" for k in dict.fromkeys(judged_here[:1] + flagged)]

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


def outcomes_by_test(result: dict) -> dict[str, dict]:
    """test id -> its outcome (``TestOutcome.as_dict``: score, points, verdicts), from ``Report.as_result``."""
    return {o["test_id"]: o for o in result["outcomes"]}


def told(outcome: dict) -> str:
    """An outcome's messages, one a line (a test can report a hint after its main reason)."""
    return "".join(v["message"] + "\n" for v in outcome["verdicts"])


def _project_digest() -> dict[str, str]:
    """Every file of the project that grading must leave alone (the grader, the course, the tests)."""
    from support import ROOT
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in ("autograder", "coursekit", "coursegen", "course", "solutions", "source", "chapters", "tests")
            for p in sorted((ROOT / folder).rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def check_mistake(expected: dict, result: dict, test_points: dict):
    assert "error" not in result, result
    outcomes = outcomes_by_test(result)
    assert set(outcomes) == set(test_points), outcomes
    for test_id, points in test_points.items():
        o = outcomes[test_id]
        if test_id in expected:
            assert (o["score"], o["points"]) == (0, points) and o["verdicts"], (test_id, o)
            assert expected[test_id] in told(o), (test_id, told(o))
        else:
            assert (o["score"], o["points"], o["verdicts"]) == (points, points, []), (test_id, told(o))


class CatalogTests:
    """The tests every chapter's catalog runs: a chapter's module subclasses this with ``catalog = CATALOG``.
    Its cases are parametrized by tests/conftest.py (``correct_case``, ``mistake_case``...) from the
    module's ``CATALOG``, the same object."""

    catalog: Catalog

    @pytest.fixture(scope="class")
    def judged(self, judge_catalog):
        """The correct styles and mistakes, judged in process (all but the kernel-only mistakes)."""
        kernel = {f"mistake:{k}" for k in self.catalog.kernel_only}
        return judge_catalog({k: v for k, v in self.catalog.notebooks().items()
                              if not k.startswith(("tamper:", "disguised:")) and k not in kernel})

    @pytest.fixture(scope="class")
    def graded(self, grade_catalog):
        """Tampering, the kernel-only mistakes and the sample, through the real pipeline; with the
        project's files before and after."""
        before = _project_digest()
        notebooks = self.catalog.notebooks()
        # The kernel-only mistakes first: each of their looping cells waits out its time limit, while
        # the other worker grades the rest.
        order = [*(f"mistake:{k}" for k in self.catalog.kernel_mistakes()), *self.catalog.sample(),
                 *(k for k in notebooks if k.startswith(("tamper:", "disguised:")))]
        results = grade_catalog({k: notebooks[k] for k in order})
        return results, before

    @pytest.fixture(scope="class")
    def test_points(self):
        return ChapterInfo(self.catalog.chapter).tests

    def test_correct_styles_get_full_marks(self, judged, test_points, correct_case):
        """A correct style, however written, gets every point."""
        result = judged[f"correct:{correct_case}"]
        assert result.get("score") == sum(test_points.values()), result

    def test_mistakes_lose_exactly_their_points_with_a_named_reason(self, judged, test_points, mistake_case):
        """A mistake judged in process loses its own tests, each with the words it names; the others pass."""
        check_mistake(self.catalog.expected_losses(mistake_case), judged[f"mistake:{mistake_case}"], test_points)

    def test_kernel_only_mistakes_lose_exactly_their_points_with_a_named_reason(self, graded, test_points,
                                                                               kernel_case):
        """A looping call or a dead kernel, as the sandboxed kernel meets it: only its own tests lose."""
        check_mistake(self.catalog.expected_losses(kernel_case), graded[0][f"mistake:{kernel_case}"], test_points)

    def test_tampering_gains_nothing(self, graded, tamper_case):
        """A trick without a solution scores 0 and breaks no grading."""
        result = graded[0][f"tamper:{tamper_case}"]
        assert "error" not in result, result
        assert result["score"] == 0.0, result

    def test_patched_comparisons_hide_no_mistake(self, graded, test_points, disguised_case):
        """A mistake graded in a kernel whose comparisons say "equal" to anything loses what it loses alone."""
        _, base = self.catalog.disguised[disguised_case]
        check_mistake(self.catalog.expected_losses(base), graded[0][f"disguised:{disguised_case}"], test_points)

    def test_the_real_pipeline_gives_the_in_process_result(self, graded, judged, sample_case):
        """Same scores, same feedback lines: the in-process tier judges what the kernel would return."""
        real, in_process = graded[0][sample_case], judged[sample_case]
        assert real == in_process, _differences(real, in_process)

    def test_grading_changes_no_file_of_the_project(self, graded):
        """After this chapter's tampering cases ran (whatever order the tests run in)."""
        before, after = graded[1], _project_digest()
        assert sorted(p for p in {*before, *after} if before.get(p) != after.get(p)) == []


def _differences(real: dict, in_process: dict) -> str:
    """What the sandboxed result says that the in-process one does not, exercise by exercise."""
    lines = [f"{key}: {real.get(key)!r} != {in_process.get(key)!r}" for key in sorted({*real, *in_process})
             if key != "exercises" and real.get(key) != in_process.get(key)]
    exercises = real.get("exercises", {}), in_process.get("exercises", {})
    lines += [f"{name}: {exercises[0].get(name)!r} != {exercises[1].get(name)!r}"
              for name in sorted({*exercises[0], *exercises[1]}) if exercises[0].get(name) != exercises[1].get(name)]
    return "sandboxed != in process: " + "; ".join(lines)


# Small helpers every catalog writes its answers with.
def submitter(chapter: str):
    """``sub(answers=None, **kwargs)``: a notebook of CHAPTER with ``answers`` in place of the reference's
    (``support.submission``)."""
    from support import submission
    return functools.partial(submission, chapter=chapter)


def body(code: str, indent: int = 8) -> str:
    """``code`` as the body of a method (``indent`` 8) or of a function (4)."""
    import textwrap
    return textwrap.indent(textwrap.dedent(code).strip(), " " * indent) + "\n"


def fn(signature: str, code: str) -> str:
    """A function ``def SIGNATURE:`` whose body is ``code``."""
    return f"def {signature}:\n" + body(code, 4)


def others_stubbed(chapter: str, answers: dict, losses: dict) -> tuple:
    """``answers`` with every other exercise of CHAPTER left as its stub: (notebook, ``losses`` plus
    "not implemented yet" for each test of a stubbed exercise). An independence case: the stubs cost
    their own tests, and the answers lose exactly what they lose beside the reference."""
    from support import submission
    info = ChapterInfo(chapter)
    stubs = {t: "not implemented yet" for t in info.tests if info.exercise_of(t) not in answers}
    return submission(answers, base="stub", chapter=chapter), {**stubs, **losses}
