"""The learner notebook reads well in plain Jupyter, Colab and VS Code: no MyST, hints collapsed.

The book renders MyST (glued numbers, dropdowns, admonitions); a learner's Jupyter does not,
and showed ``{glue:text}`name``` and every hint and answer open beside its question. The
learner notebook is made plain (``coursegen.learner_view``), the feedback page renders the prose
of any notebook plain (``autograder.myst``), and the book keeps its MyST.
"""
import re

import nbformat
import pytest
from bs4 import BeautifulSoup
from markdown_it import MarkdownIt

from support import ROOT
from coursekit import conventions as C
from coursekit.conventions import EDITIONS
from coursekit.myst_plain import MYST, glue_names, render

CHAPTERS = sorted(p.stem for p in (ROOT / "course").glob("[0-9][0-9]_*.py"))
DROPDOWN = re.compile(r"^[ \t]*(`{3,}|:{3,})\{dropdown\}[ \t]*(?P<title>.*)$", re.M)
COMMONMARK = MarkdownIt("commonmark", {"html": True})  # as Jupyter, Colab and VS Code read a markdown cell


def notebooks(chapter, language):
    return (nbformat.read(C.learner_notebook(chapter, language), as_version=4),
            nbformat.read(C.instructor_notebook(chapter, language), as_version=4))


def myst_left(markdown: str) -> list[str]:
    return [markdown[max(0, m.start() - 60):m.end() + 60] for m in MYST.finditer(markdown)]


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_myst_in_the_learner_notebook(chapter, language):
    learner, _ = notebooks(chapter, language)
    found = [f"cell {number}: ...{text}..." for number, cell in enumerate(learner.cells)
             if cell.cell_type == "markdown" for text in myst_left(cell.source)]
    assert not found, f"{C.learner_notebook(chapter, language).relative_to(ROOT)} shows MyST markup:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_feedback_page_renders_prose_without_myst(chapter, language):
    """The feedback page's renderer, on the instructor notebook's MyST (a notebook made before the
    learner notebooks were plain) and on the learner notebook."""
    from autograder.myst import rewrite
    learner, instructor = notebooks(chapter, language)
    found = [f"cell {number}: ...{text}..." for nb in (instructor, learner) for number, cell in enumerate(nb.cells)
             if cell.cell_type == "markdown" for text in myst_left(rewrite(cell.source))]
    assert not found, f"{chapter} ({language}): the feedback page would show MyST:\n" + "\n".join(found)


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_hints_and_answers_are_collapsed(chapter, language):
    """Every dropdown of the book is a closed ``<details>`` in the notebook, its whole body inside it."""
    learner, instructor = notebooks(chapter, language)
    dropdowns = 0
    for number, (cell, book) in enumerate(zip(learner.cells, instructor.cells)):
        if cell.cell_type != "markdown" or "nbgrader" in cell.metadata:
            continue
        titles = [m["title"].strip() for m in DROPDOWN.finditer(book.source)]
        if not titles:
            assert "<details" not in cell.source, f"{chapter} cell {number}: a <details> the book has no dropdown for"
            continue
        dropdowns += len(titles)
        page = BeautifulSoup(COMMONMARK.render(cell.source), "html.parser")
        details = page.find_all("details")
        assert len(details) == len(titles), f"{chapter} cell {number}: {len(details)} <details> for {titles}"
        for title, block in zip(titles, details):
            assert not block.has_attr("open"), f"{chapter} cell {number}: {title!r} is shown open"
            summary = block.find("summary")
            assert summary is not None and summary.get_text().strip() == BeautifulSoup(
                COMMONMARK.renderInline(title), "html.parser").get_text().strip(), \
                f"{chapter} cell {number}: the summary reads {summary and summary.get_text()!r}, the book {title!r}"
            assert block.get_text().strip() != summary.get_text().strip(), \
                f"{chapter} cell {number}: {title!r} collapses nothing"
            # the body is read as Markdown inside the block: a paragraph, code, math, not raw text
            assert block.find(["p", "ul", "ol", "pre"]), f"{chapter} cell {number}: {title!r}'s body is not Markdown"
        outside = page.get_text()
        for block in details:
            outside = outside.replace(block.get_text(), "")
        for block in details:
            first = next(line for line in block.get_text().splitlines()[1:] if line.strip())
            assert first not in outside, f"{chapter} cell {number}: the hidden text is shown open too: {first!r}"
    questions = [c for c in instructor.cells if c.cell_type == "markdown" and DROPDOWN.search(c.source)]
    assert dropdowns == sum(len(DROPDOWN.findall(c.source)) for c in questions) > 0


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_glued_numbers_are_named_and_printed(chapter, language):
    """A glued number reads as the name the learner's run prints, said once under its cell; the
    learner's glue prints it (myst_nb's, when installed, would show nothing)."""
    learner, instructor = notebooks(chapter, language)
    code = "\n".join(c.source for c in learner.cells if c.cell_type == "code")
    assert "myst_nb" not in code, f"{chapter}: the learner notebook still imports myst_nb's glue"
    namespace = {}
    glue_def = re.search(r"^def glue\(.*\n(?:[ \t]+.*\n?)+", code, re.M)
    assert glue_def, f"{chapter}: no glue of its own in the learner notebook"
    exec(glue_def.group(), namespace)
    printed = []
    namespace["print"] = printed.append
    namespace["glue"]("ratio", 12.5, display=False)
    assert printed == ["ratio = 12.5"]
    for number, (cell, book) in enumerate(zip(learner.cells, instructor.cells)):
        if cell.cell_type == "markdown" and "nbgrader" not in cell.metadata:
            names = glue_names(book.source)
            if not names:
                continue
            prose, note = cell.source.rsplit("\n\n", 1)
            for name in names:
                assert f"`{name}`" in prose and f"`{name}`" in note, f"{chapter} cell {number}: {name} is not named"
            assert note.startswith("*") and note.endswith("*") and " = " in note, \
                f"{chapter} cell {number}: the glued names are not explained: {note!r}"


@pytest.mark.parametrize("chapter", CHAPTERS[:1])
def test_the_book_keeps_its_myst(chapter):
    """The book's page reads the instructor notebook's MyST and its run glues with myst_nb."""
    from coursegen.learner_view import with_book_sources
    learner, instructor = notebooks(chapter, C.SOURCE_LANGUAGE)
    page = with_book_sources(nbformat.from_dict(learner), instructor, "markdown")
    run = with_book_sources(nbformat.from_dict(learner), instructor, "code")
    assert [c.source for c in page.cells if c.cell_type == "markdown" and "nbgrader" not in c.metadata] == \
        [c.source for c in instructor.cells if c.cell_type == "markdown" and "nbgrader" not in c.metadata]
    assert any("{glue:text}" in c.source for c in page.cells) and \
        any("from myst_nb import glue" in c.source for c in run.cells)
    answers = [c for c in run.cells if "nbgrader" in c.metadata]  # stubs and tests stay the learner's
    assert answers == [c for c in learner.cells if "nbgrader" in c.metadata]


def test_render_of_each_construct():
    text = "\n".join([
        "Before {glue:text}`speed:.1f` times, see {numref}`Figure <fig-a>` and {math}`x^2`.",
        "",
        ":::{dropdown} Hint: `masked_fill`",
        "Use `masked_fill`.",
        ":::",
        "",
        "1. A question?",
        "",
        "   ```{dropdown} Answer",
        "   Because.",
        "",
        "   ```{note}",
        "   Nested.",
        "   ```",
        "   ```",
        "",
        ":::{admonition} A title",
        ":class: warning",
        "Body $a$.",
        ":::",
        "",
        "```python",
        "{glue:text}`kept` in code",
        "```",
    ])
    plain = render(text)
    assert not myst_left(plain.replace("{glue:text}`kept`", "")), plain
    assert "Before `speed` times, see Figure and $x^2$." in plain
    assert "<details><summary>Hint: <code>masked_fill</code></summary>\n\nUse `masked_fill`.\n\n</details>" in plain
    assert "   <details><summary>Answer</summary>\n\n   Because.\n\n   > **Note**\n   >\n   > Nested.\n\n   </details>" \
        in plain
    assert "> **A title**\n>\n> Body $a$." in plain and ":class:" not in plain
    assert "```python\n{glue:text}`kept` in code\n```" in plain  # code is shown as written
    boxed = render(text, boxes=True)
    assert '<div class="admonition admonition warning">' in boxed


@pytest.mark.parametrize("language", EDITIONS)
def test_a_class_release_hands_out_the_plain_learner_notebook(tmp_path, language):
    """``release`` (nbgrader's generate_assignment) puts the learner notebook in the release folder and
    the handout, not nbgrader's copy of the instructor notebook's MyST."""
    from autograder.chapters import ChapterInfo
    from autograder.classroom.release import release
    chapter = CHAPTERS[0]
    [handout] = release(tmp_path / "class", [ChapterInfo(chapter, language)], tmp_path / "handout")
    released = tmp_path / "class" / "release" / chapter / f"{chapter}.ipynb"
    for path in (handout, released):
        assert path.read_bytes() == C.learner_notebook(chapter, language).read_bytes(), path
