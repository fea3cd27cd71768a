"""MyST directives in markdown cells, as HTML that plain Markdown renderers show like the book.

The book (Jupyter Book) renders ```` ```{note} ```` and ```` ```{admonition} Title ````
blocks as boxes; nbconvert's Markdown renderer shows them as code. ``MystDirectives``
rewrites each such block of a markdown cell into an HTML box whose body stays Markdown
(so math and emphasis inside still render), before the notebook is exported.
"""
from __future__ import annotations

import html
import re

from nbconvert.preprocessors import Preprocessor

ADMONITIONS = ("note", "warning", "tip", "hint", "important", "caution", "attention", "danger", "error",
               "seealso")
# ```{name} argument  ...  ```   or   :::{name} argument  ...  :::   (same fence length to close)
DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[A-Za-z][\w-]*)\}[ \t]*(?P<arg>[^\n]*)\n"
                       r"(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)
OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>[^\n]*)$")

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
    """Markdown with every MyST directive block replaced by HTML (admonitions) or its body."""
    return DIRECTIVE.sub(_directive_html, markdown)


def _directive_html(match: re.Match) -> str:
    name, arg = match["name"].lower(), match["arg"].strip()
    lines = match["body"].splitlines()
    options = {}
    while lines and OPTION.match(lines[0]):
        option = OPTION.match(lines.pop(0))
        options[option["key"]] = option["value"].strip()
    body = rewrite("\n".join(lines).strip("\n"))  # directives may nest
    if name not in ADMONITIONS and name != "admonition":
        return body + "\n"  # e.g. a figure or an epigraph: its content, without the markup
    title = arg if name == "admonition" else (name.capitalize() if name != "seealso" else "See also")
    classes = " ".join(["admonition", name, *options.get("class", "").split()])
    # A blank line ends each HTML block, so the body between them is read as Markdown.
    return (f'<div class="{html.escape(classes)}">\n<p class="admonition-title">{html.escape(title)}</p>\n\n'
            f"{body}\n\n</div>\n")


class MystDirectives(Preprocessor):
    """nbconvert preprocessor: MyST directive blocks of markdown cells become HTML boxes."""

    enabled = True  # nbconvert preprocessors are off unless enabled

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown" and ("```{" in cell.source or ":::{" in cell.source):
            cell.source = rewrite(cell.source)
        return cell, resources
