"""A visible test that stops on an error in the learner's code says first which test, which function
raised what, and what the test checks; the traceback follows and the cell still fails.

The learner notebook's setup cell installs the report (``coursegen.visible_test_errors``); these
tests run the learner notebook's own cells in a real Jupyter kernel (nbclient), with a planted
``paged_attention`` that reads one block past its block table.
"""
import re

import nbformat
import pytest
from nbclient import NotebookClient

from support import ROOT
from coursegen import visible_test_errors
from coursekit import conventions as C
from coursekit.conventions import EDITIONS

CHAPTERS = C.chapter_names()
CHAPTER = "08_modern_attention"
TEST = "test_paged_attention"
HAN = re.compile(r"[\u4e00-\u9fff]")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

PAST_THE_TABLE = '''
def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    block_size = k_cache.shape[2]
    keys = [k_cache[block_table[0, t // block_size], :, t % block_size]
            for t in range(block_table.shape[1] * block_size + 1)]   # one block too many
    return torch.stack(keys)
'''
ZEROS = '''
def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    return torch.zeros_like(query)
'''
NOTHING_RETURNED = '''
def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    query.sum()
'''


def _learner_notebook(language):
    return nbformat.read(C.learner_notebook(CHAPTER, language), as_version=4)


def _grade_id(cell):
    return cell.metadata.get("nbgrader", {}).get("grade_id")


@pytest.fixture(scope="module", params=EDITIONS)
def ran(request, tmp_path_factory):
    """(language, the test cell's source, {case: the error output of the test cell}): the chapter's
    export cells and setup cell, then each answer in turn followed by the visible test."""
    language = request.param
    nb = _learner_notebook(language)
    setup = [c for c in nb.cells if "_visible_test_stopped" in c.source]
    exports = [c for c in nb.cells if C.role(c) == "export"]
    stub = next(c for c in nb.cells if _grade_id(c) == "paged_attention")
    test = next(c for c in nb.cells if _grade_id(c) == TEST)
    answers = {"past the table": PAST_THE_TABLE, "stub": stub.source, "zeros": ZEROS, "nothing returned": NOTHING_RETURNED}
    sources = [c.source for c in exports + setup] + ["{}[0]  # an error outside any visible test"]
    for answer in answers.values():
        sources += [answer, test.source]
    run = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources], metadata=nb.metadata)
    NotebookClient(run, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path_factory.mktemp("visible"))}}).execute()

    def error(cell):
        found = [o for o in cell.outputs if o.output_type == "error"]
        return found[0] if found else None
    assert all(error(c) is None for c in run.cells[:len(exports) + len(setup)]), "the setup cells failed"
    outside = error(run.cells[len(exports) + len(setup)])
    tests = run.cells[len(exports) + len(setup) + 2::2]
    return language, test.source, outside, dict(zip(answers, map(error, tests)))


def _first_line(output) -> str:
    return ANSI.sub("", output.traceback[0])


def _docstring(source: str) -> str:
    import ast
    return " ".join(ast.get_docstring(ast.parse(source)).split())


def _in_edition(text: str, language: str) -> str:
    from coursegen.catalogs import FEEDBACK, translations
    return text if language == C.SOURCE_LANGUAGE else translations(FEEDBACK, language)[text]


def _stopped(ran, case: str, ename: str):
    """(what the edition's message says, given its fields; the first line shown; the error output) of
    CASE, whose test cell must have failed with ENAME (the learner's own exception, kept)."""
    language, source, _, outputs = ran
    output = outputs[case]
    assert output is not None and output.ename == ename, f"{case}: the cell must still fail with {ename}"

    def expected(text, **fields):
        return _in_edition(text, language).format(test=TEST, check=_docstring(source), **fields)
    return expected, _first_line(output), output


def test_a_crash_in_the_learners_function_is_named_in_the_first_line(ran):
    """An IndexError in paged_attention: the first line names the test, the function, the exception
    with its message, and what the test checks (in the edition's language); the traceback follows."""
    expected, first, crash = _stopped(ran, "past the table", "IndexError")
    assert "out of bounds" in crash.evalue and "\n" not in first
    assert first == expected(visible_test_errors.RAISED, function="paged_attention", error=f"IndexError: {crash.evalue}")
    assert TEST in first and "`paged_attention`" in first and crash.evalue in first
    assert bool(HAN.search(first)) == (ran[0] != C.SOURCE_LANGUAGE), f"the line is not in the edition's language: {first!r}"
    traceback = ANSI.sub("", "\n".join(crash.traceback[1:]))
    assert "IndexError" in traceback and "one block too many" in traceback, "the traceback is not kept"


def test_an_unwritten_stub_is_said_to_be_not_written(ran):
    """The untouched stub (``raise NotImplementedError()``): the function is not written yet."""
    expected, first, _ = _stopped(ran, "stub", "NotImplementedError")
    assert first == expected(visible_test_errors.NOT_WRITTEN, function="paged_attention")


def test_an_error_in_the_tests_own_lines_points_at_what_the_function_returned(ran):
    """No function of the notebook in the traceback: `pa_out.shape` on None is the test's own line."""
    expected, first, _ = _stopped(ran, "nothing returned", "AttributeError")
    assert first == expected(visible_test_errors.OWN_LINES, error="AttributeError: 'NoneType' object has no attribute 'shape'")


def test_assertions_and_errors_outside_visible_tests_are_shown_as_before(ran):
    """A failed assertion shows its own message, and an error in another cell IPython's traceback, unchanged."""
    _, _, outside, outputs = ran
    wrong = outputs["zeros"]
    assert wrong is not None and wrong.ename == "AssertionError" \
        and "block_table[b, t // block_size]" in wrong.evalue
    assert TEST not in "\n".join(wrong.traceback) and "_visible_test_stopped" not in "\n".join(wrong.traceback)
    assert outside is not None and outside.ename == "KeyError"
    assert outside.traceback[0] == wrong.traceback[0] and TEST not in "\n".join(outside.traceback), \
        "an error outside a visible test gets a line of its own"


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_visible_test_is_named_and_every_notebook_reports_stops(chapter, language):
    """Each test cell's first line names it (what the report reads); the setup cell, before every
    test cell, installs the report once; the instructor notebook (the book's given code) has none."""
    nb = nbformat.read(C.learner_notebook(chapter, language), as_version=4)
    tests = [(i, c) for i, c in enumerate(nb.cells) if C.is_test_cell(c)]
    unnamed = [C.grade_id(c) for _, c in tests if not re.match(rf"# .*\b{C.grade_id(c)}\n", c.source)]
    assert tests and not unnamed, f"{chapter} ({language}): test cells whose first line does not name them: {unnamed}"
    setups = [i for i, c in enumerate(nb.cells) if "set_custom_exc((Exception,), _visible_test_stopped)" in c.source]
    assert len(setups) == 1 and setups[0] < tests[0][0] and C.role(nb.cells[setups[0]]) == "given", setups
    instructor = nbformat.read(C.instructor_notebook(chapter, language), as_version=4)
    assert not any("_visible_test_stopped" in c.source for c in instructor.cells)
