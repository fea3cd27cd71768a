"""Every figure's alt text says what that figure shows, in both editions (``coursegen.figure_alt``).

The alt text is read from the code that draws the figure; these tests read it from the
instructor notebooks without running them (the book's pages are checked in ``test_accessibility``).
"""
from __future__ import annotations

import ast

import nbformat
import pytest

from support import ROOT

from coursegen.figure_alt import _defined, _functions, alt_text, with_figure_alt_text
from coursekit.conventions import chapter_names

EDITIONS = {"en": ROOT / "source", "zh_CN": ROOT / "source" / "zh_CN"}


def _alt_texts(chapter: str, language: str) -> list[tuple[int, str]]:
    """(cell, alt text) of every cell that shows a figure, names read as the cells before define them."""
    nb = nbformat.read(EDITIONS[language] / chapter / f"{chapter}.ipynb", as_version=4)
    trees = {i: ast.parse(c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    functions, env, found = _functions(list(trees.values())), {}, []
    for number, cell in enumerate(nb.cells):
        if number in trees:
            if "plt.show()" in cell.source:
                found.append((number, alt_text(cell.source, functions, env, language)))
            env = _defined(trees[number], env)
    return found


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", chapter_names())
def test_every_figure_is_described_by_its_own_title(chapter, language):
    texts = _alt_texts(chapter, language)
    assert texts, f"{chapter}: no figure found"
    vague = [(n, t) for n, t in texts
             if not t.startswith(("Figure: ", "图：")) or "…" in t.split("。")[0].split(". ")[0] or "–" in t]
    assert not vague, f"{chapter} ({language}): alt texts that do not say what the figure shows: {vague}"


def test_a_name_means_what_the_cells_so_far_define():
    """Two cells reuse ``fig_text``: each figure is described by its own, and a loop's values are named."""
    nb = nbformat.v4.new_notebook()
    draw = "import matplotlib.pyplot as plt\nfig_text = {{'title': {!r}}}\nplt.title(fig_text['title'])\nplt.show()"
    nb.cells = [nbformat.v4.new_code_cell(draw.format("first")), nbformat.v4.new_code_cell(draw.format("second")),
                nbformat.v4.new_code_cell("for h in (2, 4):\n    plt.suptitle(f'{h} heads')\n    plt.show()")]
    for cell in nb.cells:
        cell.outputs = [nbformat.v4.new_output("display_data", data={"image/png": ""})]
    alts = [c.metadata["mystnb"]["image"]["alt"] for c in with_figure_alt_text(nb).cells]
    assert alts == ["Figure: first", "Figure: second", "Figure: 2/4 heads"], alts
