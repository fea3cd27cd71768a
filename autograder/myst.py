"""MyST in markdown cells, as HTML that plain Markdown renderers show like the book.

The book (Jupyter Book) renders ```` ```{note} ```` and ```` ```{admonition} Title ````
blocks as boxes, dropdowns collapsed and glued numbers in the text; nbconvert's Markdown
renderer shows the markup as code. ``MystDirectives`` rewrites each markdown cell with
``coursekit.myst_plain`` (HTML boxes whose body stays Markdown, so math and emphasis inside
still render; ``<details>``; roles as their text) before the notebook is exported. Learner
notebooks are plain already; a notebook made before they were is not.
"""
from __future__ import annotations

from nbconvert.preprocessors import Preprocessor

from coursekit.myst_plain import MYST, render

CSS = """
div.admonition { margin: 1em 0; padding: 0 0.8em 0.2em; border-left: 0.25em solid #0d6efd;
                 background: #f2f6fd; border-radius: 0.2em; }
div.admonition > p.admonition-title { margin: 0 -0.8em 0.6em; padding: 0.35em 0.8em; font-weight: bold;
                 background: #dbe6fb; }
div.admonition.warning, div.admonition.caution, div.admonition.attention { border-color: #e8a317;
                 background: #fff8e6; }
div.admonition.warning > p.admonition-title, div.admonition.caution > p.admonition-title,
div.admonition.attention > p.admonition-title { background: #fdebc3; }
div.admonition.danger, div.admonition.error { border-color: #dc3545; background: #fdf0f1; }
div.admonition.danger > p.admonition-title, div.admonition.error > p.admonition-title { background: #f8d3d7; }
div.admonition.tip, div.admonition.hint, div.admonition.important, div.admonition.seealso {
                 border-color: #198754; background: #eff8f3; }
div.admonition.tip > p.admonition-title, div.admonition.hint > p.admonition-title,
div.admonition.important > p.admonition-title, div.admonition.seealso > p.admonition-title {
                 background: #cfeadb; }
"""


def rewrite(markdown: str) -> str:
    """Markdown with every MyST directive block as HTML (admonitions as boxes, dropdowns as
    ``<details>``) and every role as plain text (``coursekit.myst_plain``)."""
    return render(markdown, boxes=True)


class MystDirectives(Preprocessor):
    """nbconvert preprocessor: MyST directive blocks of markdown cells become HTML boxes."""

    enabled = True  # nbconvert preprocessors are off unless enabled

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown" and MYST.search(cell.source):
            cell.source = rewrite(cell.source)
        return cell, resources
