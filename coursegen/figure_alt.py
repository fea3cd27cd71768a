"""Alt text for the book's figures: the figure's titles and axis labels, read from the code that draws it.

Figures are PNG outputs of executed notebook cells, so nothing describes them but the code.
The titles (``set_title``, ``suptitle``) and axis labels (``set_xlabel``, ``set_ylabel``)
passed to Matplotlib as literals, or looked up in a dict literal of the notebook
(``text["title"]``), say what a figure shows; a translated notebook passes translated
strings, so its alt text is in its language. The alt text goes where MyST-NB reads it:
the cell's ``mystnb.image.alt`` metadata, applied to every image the cell outputs.
"""
from __future__ import annotations

import ast
import re

import nbformat

from coursekit.conventions import SOURCE_LANGUAGE

TITLES = {"set_title", "suptitle", "title"}
X_LABELS = {"set_xlabel", "xlabel"}
Y_LABELS = {"set_ylabel", "ylabel"}
# The words around the titles, per edition.
WORDS = {
    SOURCE_LANGUAGE: {"figure": "Figure: {}", "axes": "horizontal axis: {x}; vertical axis: {y}",
                      "none": "Figure drawn by the code above", "sep": ". ", "and": "; "},
    "zh_CN": {"figure": "图：{}", "axes": "横轴：{x}；纵轴：{y}", "none": "由上方代码绘制的图", "sep": "。", "and": "；"},
}
TEX = {r"\partial": "∂", r"\sqrt": "√", r"\|": "‖", r"\cdot": "·", r"\times": "×", r"\approx": "≈",
       r"\leq": "≤", r"\geq": "≥", r"\ell": "ℓ", r"\infty": "∞", r"\to": "→", r"\ldots": "…", r"\dots": "…"}


def plain(text: str) -> str:
    """Mathtext as a reader hears it: no dollars, braces or backslash commands; one line."""
    for tex, char in TEX.items():
        text = text.replace(tex, char)
    text = re.sub(r"\\([A-Za-z]+)", r"\1", text).replace("$", "").replace("{", "").replace("}", "")
    return " ".join(text.split())


def _dict_literals(trees: list[ast.AST]) -> dict[str, dict[str, str]]:
    """name -> {key: string} for every ``name = {"key": "string", ...}`` in the notebook."""
    found = {}
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            if isinstance(node.value, ast.Dict):
                pairs = [(k.value, v) for k, v in zip(node.value.keys, node.value.values) if isinstance(k, ast.Constant)]
            elif isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "dict":
                pairs = [(k.arg, k.value) for k in node.value.keywords if k.arg]   # dict(title="...", ...)
            else:
                continue
            entries = {k: v.value for k, v in pairs if isinstance(v, ast.Constant) and isinstance(v.value, str)}
            for target in node.targets:
                if isinstance(target, ast.Name) and entries:
                    found.setdefault(target.id, {}).update(entries)
    return found


def _texts(arg: ast.AST, dicts: dict[str, dict[str, str]]) -> list[str]:
    """The strings ARG stands for: a literal, an f-string, a list of them, or an entry of a dict literal."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr):  # an f-string: its literal parts, "…" for each value
        return ["".join(v.value if isinstance(v, ast.Constant) else "…" for v in arg.values)]
    if isinstance(arg, (ast.List, ast.Tuple)):
        return [t for element in arg.elts for t in _texts(element, dicts)]
    if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name) and isinstance(arg.slice, ast.Constant):
        found = dicts.get(arg.value.id, {}).get(arg.slice.value)
        return [found] if found else []
    return []


def _functions(trees: list[ast.AST]) -> dict[str, ast.FunctionDef]:
    return {node.name: node for tree in trees for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def _labels(tree: ast.AST, functions, dicts, seen: set[str]) -> dict[str, list[str]]:
    """Titles and axis labels drawn by TREE, and by the notebook's functions it calls."""
    out = {"title": [], "x": [], "y": []}
    if isinstance(tree, ast.FunctionDef):  # def draw(text=SOME_DICT): text["title"] is SOME_DICT's
        params = tree.args.args[len(tree.args.args) - len(tree.args.defaults):]
        dicts = {**dicts, **{p.arg: dicts[d.id] for p, d in zip(params, tree.args.defaults)
                             if isinstance(d, ast.Name) and d.id in dicts}}

    def add(kind, arg):
        for text in _texts(arg, dicts):
            if plain(text) and plain(text) not in out[kind]:
                out[kind].append(plain(text))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        kind = "title" if name in TITLES else "x" if name in X_LABELS else "y" if name in Y_LABELS else None
        if kind and node.args:
            add(kind, node.args[0])
        for keyword in node.keywords:  # a helper called with title=..., titles=[...], xlabel=...
            key = {"title": "title", "titles": "title", "suptitle": "title", "xlabel": "x", "ylabel": "y"}.get(keyword.arg)
            if key:
                add(key, keyword.value)
        if name in functions and name not in seen:  # a drawing helper defined in an earlier cell
            inner = _labels(functions[name], functions, dicts, seen | {name})
            for key, values in inner.items():
                out[key] += [v for v in values if v not in out[key]]
    return out


def alt_text(source: str, functions, dicts, language: str) -> str:
    words = WORDS.get(language, WORDS[SOURCE_LANGUAGE])
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return words["none"]
    labels = _labels(tree, functions, dicts, set())
    parts = [words["figure"].format(words["and"].join(labels["title"]))] if labels["title"] else []
    if labels["x"] or labels["y"]:
        parts.append(words["axes"].format(x=words["and"].join(labels["x"]) or "–",
                                          y=words["and"].join(labels["y"]) or "–"))
    return words["sep"].join(parts) or words["none"]


def with_figure_alt_text(nb: nbformat.NotebookNode, language: str = SOURCE_LANGUAGE) -> nbformat.NotebookNode:
    """NB with alt text on every code cell that outputs an image (the page shows it; the notebook is unchanged)."""
    trees = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            try:
                trees.append(ast.parse(cell.source))
            except SyntaxError:
                pass
    functions, dicts = _functions(trees), _dict_literals(trees)
    for cell in nb.cells:
        if cell.cell_type == "code" and any(k.startswith("image/") for o in cell.get("outputs", [])
                                            for k in o.get("data", {})):
            image = cell.metadata.setdefault("mystnb", {}).setdefault("image", {})
            image.setdefault("alt", alt_text(cell.source, functions, dicts, language))
    return nb
