"""The learner notebook as plain Jupyter, Colab and VS Code show it: no MyST, numbers the run prints.

nbgrader's ``generate_assignment`` makes the learner notebook from the instructor notebook, whose
markdown is the book's MyST. ``plain_notebook`` then renders each markdown cell with
``coursekit.myst_plain`` (hints and answers collapsed in ``<details>``, admonitions as block
quotes) and replaces the given cell's ``glue`` (``myst_nb``'s where installed, which shows nothing
outside the book) by one that prints ``name = value``. A glued number becomes its name, and the
cell says which code prints it: the notebook has no outputs, and the learner's run is the one
that counts. The book keeps the MyST: it takes its markdown and the glue it runs from the
instructor notebook (``coursegen.book``).
"""
from __future__ import annotations

import re

from coursekit.conventions import SOURCE_LANGUAGE
from coursekit.myst_plain import glue_names, render

# The chapters' given glue: myst_nb's in the book, a printing one without it.
BOOK_GLUE = re.compile(r"^try:[^\n]*\n[ \t]+from myst_nb import glue\n"
                       r"except ImportError:[ \t]*(?P<why>#[^\n]*)?\n(?P<fallback>(?:[ \t]+[^\n]*\n?)+)", re.M)
GLUE_CALL = re.compile(r"""\bglue\(\s*f?["'](?P<name>[^"'{]*)""")

# Said once under a markdown cell that quotes glued numbers: what the names stand for.
GLUE_NOTE = {
    SOURCE_LANGUAGE: ("*Here {names} {name} measured by the code {where}: run it and it prints {each} "
                      "as `name = value` (the book's page quotes the book's own run).*"),
    "zh_CN": "*这里的 {names} 是{where}代码测得的数值的名字：运行它，它会以 `名字 = 数值` 的形式打印每一个"
             "（书中页面引用的是书本身那次运行的结果）。*",
}
WHERE = {SOURCE_LANGUAGE: {"above": "above", "below": "below"}, "zh_CN": {"above": "上面的", "below": "下面的"}}


def plain_notebook(nb, language: str = SOURCE_LANGUAGE):
    """NB (a released learner notebook) as plain Markdown and a glue that prints; changed in place."""
    glued_at = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for call in GLUE_CALL.finditer(cell.source):
                glued_at.setdefault(call["name"], index)
            cell.source = BOOK_GLUE.sub(_printing_glue, cell.source)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        names = glue_names(cell.source)
        cell.source = render(cell.source)
        if names:
            cell.source += "\n\n" + glue_note(names, _where(names, index, glued_at), language)
    return nb


def _printing_glue(match: re.Match) -> str:
    lines = match["fallback"].rstrip("\n").split("\n")
    depth = len(lines[0]) - len(lines[0].lstrip())
    why = f"{match['why']}\n" if match["why"] else ""
    return why + "\n".join(line[depth:] for line in lines) + "\n"


def _where(names: list[str], index: int, glued_at: dict[str, int]) -> str:
    """``above`` unless every name is measured by a cell below INDEX (a name made at run time: above)."""
    cells = [next((at for prefix, at in glued_at.items() if prefix and name.startswith(prefix)), None)
             if name not in glued_at else glued_at[name] for name in names]
    return "below" if all(at is not None and at > index for at in cells) else "above"


def glue_note(names: list[str], where: str, language: str) -> str:
    codes = [f"`{name}`" for name in names]
    if language == SOURCE_LANGUAGE:
        listed = codes[0] if len(codes) == 1 else ", ".join(codes[:-1]) + " and " + codes[-1]
    else:
        listed = "、".join(codes)
    template = GLUE_NOTE.get(language, GLUE_NOTE[SOURCE_LANGUAGE])
    one = len(names) == 1
    return template.format(names=listed, where=WHERE.get(language, WHERE[SOURCE_LANGUAGE])[where],
                           name="names a number" if one else "name numbers", each="it" if one else "each")


def with_book_sources(nb, instructor, cell_type: str):
    """NB (a learner notebook) with the instructor notebook's source in each CELL_TYPE cell that
    nbgrader does not own: the book's MyST markdown (``markdown``), or the given code with
    myst_nb's glue that the book runs (``code``). Changed in place."""
    if [c.cell_type for c in nb.cells] != [c.cell_type for c in instructor.cells]:
        raise ValueError("the learner notebook's cells are not the instructor notebook's: run `make generate`")
    for cell, source in zip(nb.cells, instructor.cells):
        if cell.cell_type == cell_type and "nbgrader" not in cell.metadata:
            cell.source = source.source
    return nb
