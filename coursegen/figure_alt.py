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
    SOURCE_LANGUAGE: {"figure": "Figure: {}", "x": "horizontal axis: {}", "y": "vertical axis: {}",
                      "none": "Figure drawn by the code above", "sep": ". ", "and": "; "},
    "zh_CN": {"figure": "图：{}", "x": "横轴：{}", "y": "纵轴：{}", "none": "由上方代码绘制的图", "sep": "。", "and": "；"},
}
TEX = {r"\top": "ᵀ", r"\,": " ", r"\partial": "∂", r"\sqrt": "√", r"\|": "‖", r"\cdot": "·", r"\times": "×", r"\approx": "≈",
       r"\leq": "≤", r"\geq": "≥", r"\ell": "ℓ", r"\infty": "∞", r"\to": "→", r"\ldots": "…", r"\dots": "…"}


def plain(text: str) -> str:
    """Mathtext as a reader hears it: no dollars, braces or backslash commands; one line."""
    for tex, char in TEX.items():
        text = text.replace(tex, char)
    text = re.sub(r"\\([A-Za-z]+)", r"\1", text).replace("$", "").replace("{", "").replace("}", "")
    return " ".join(text.split())


def _resolve(node: ast.AST, env: dict) -> list | dict | None:
    """What NODE stands for: a list of the strings it may be, a dict (a figure-text dict literal), or None.

    ENV maps names to what they stood for where the figure is drawn: the notebook's string and
    number constants and dict literals, as defined by the cells so far, a loop's values and a
    drawing helper's arguments."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)) and not isinstance(node.value, bool):
        return [str(node.value)]
    if isinstance(node, ast.Name):
        return env.get(node.id)
    if isinstance(node, ast.JoinedStr):  # an f-string: its fields resolved where they can be, "…" elsewhere
        text = ""
        for value in node.values:
            found = value.value if isinstance(value, ast.Constant) else _resolve(value.value, env)
            text += found if isinstance(found, str) else "/".join(found) if isinstance(found, list) and found else "…"
        return [text]
    if isinstance(node, (ast.List, ast.Tuple)):
        found = [_resolve(e, env) for e in node.elts]
        return [t for f in found if isinstance(f, list) for t in f]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # title + f"..."
        left, right = _resolve(node.left, env), _resolve(node.right, env)
        if isinstance(left, list) and isinstance(right, list):
            return [a + b for a in left for b in right][:6]
        return None
    if isinstance(node, ast.IfExp):
        found = [_resolve(node.body, env), _resolve(node.orelse, env)]
        return [t for f in found if isinstance(f, list) for t in f] or None
    if isinstance(node, ast.Subscript):  # text["title"], FIG["panel"]["x"], text["bwd" if b else "fwd"]
        base, keys = _resolve(node.value, env), _resolve(node.slice, env)
        if isinstance(base, dict) and keys:
            found = [base.get(k) for k in keys]
            if len(found) == 1 and isinstance(found[0], dict):
                return found[0]
            return [t for f in found if isinstance(f, list) for t in f] or None
        return None
    if isinstance(node, (ast.Dict, ast.Call)):
        if isinstance(node, ast.Dict):
            pairs = [(k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)]
        elif getattr(node.func, "id", None) == "dict":
            pairs = [(k.arg, k.value) for k in node.keywords if k.arg]   # dict(title="...", ...)
        else:
            return None
        entries = {k: _resolve(v, env) for k, v in pairs}
        return {k: v for k, v in entries.items() if v is not None} or None
    return None


def _defined(tree: ast.AST, env: dict) -> dict:
    """ENV with the constants and dict literals TREE assigns at its top level, and its loops' values."""
    env = dict(env)
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign):
            found = _resolve(node.value, env)
            for target in node.targets:
                if isinstance(target, ast.Name) and found is not None:
                    env[target.id] = found
    for node in ast.walk(tree):  # for h in (2, 4), for ax, S, title in [(..., ..., "a"), ...]
        if not (isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, (ast.Tuple, ast.List))):
            continue
        if isinstance(node.target, ast.Name):
            found = _resolve(node.iter, env)
            if found:
                env[node.target.id] = found
        elif isinstance(node.target, ast.Tuple):
            for position, name in enumerate(node.target.elts):
                values = [_resolve(row.elts[position], env) for row in node.iter.elts
                          if isinstance(row, ast.Tuple) and len(row.elts) == len(node.target.elts)]
                values = [v for found in values if isinstance(found, list) for v in found]
                if isinstance(name, ast.Name) and values:
                    env[name.id] = values
    return env


def _functions(trees: list[ast.AST]) -> dict[str, ast.FunctionDef]:
    return {node.name: node for tree in trees for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def _arguments(function: ast.FunctionDef, call: ast.Call, env: dict) -> dict:
    """ENV inside FUNCTION as CALL calls it: its parameters bound to the defaults and the arguments."""
    params = [a.arg for a in function.args.args]
    inner = dict(env)
    for name, default in zip(params[len(params) - len(function.args.defaults):], function.args.defaults):
        inner[name] = _resolve(default, env)
    for name, arg in zip(params, call.args):
        inner[name] = _resolve(arg, env)
    for keyword in call.keywords:
        if keyword.arg in params:
            inner[keyword.arg] = _resolve(keyword.value, env)
    return {k: v for k, v in inner.items() if v is not None}


def _labels(tree: ast.AST, functions, env: dict, seen: set[str]) -> dict[str, list[str]]:
    """Titles and axis labels drawn by TREE, and by the notebook's functions it calls."""
    out = {"title": [], "x": [], "y": []}
    if isinstance(tree, ast.FunctionDef):  # a helper's own figure-text dict: text = {"title": ...}
        env = _defined(tree, env)

    def add(kind, arg):
        found = _resolve(arg, env)
        for text in found if isinstance(found, list) else []:
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
            inner = _labels(functions[name], functions, _arguments(functions[name], node, env), seen | {name})
            for key, values in inner.items():
                out[key] += [v for v in values if v not in out[key]]
    return out


def alt_text(source: str, functions, env: dict, language: str) -> str:
    """The alt text of the figure SOURCE draws; ENV: what the notebook's names stand for before it."""
    words = WORDS.get(language, WORDS[SOURCE_LANGUAGE])
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return words["none"]
    labels = _labels(tree, functions, _defined(tree, env), set())
    known = [t for t in labels["title"] if "…" not in t]  # a panel's "layer …, head …" says less than the figure's title
    titles = known or [re.sub(r"\s*[:：=]\s*…", "", t) for t in labels["title"]]  # a measured value is not known here
    parts = [words["figure"].format(words["and"].join(titles))] if titles else []
    axes = [words[axis].format(words["and"].join(labels[axis])) for axis in ("x", "y") if labels[axis]]
    if axes:
        parts.append(words["and"].join(axes))
    return words["sep"].join(parts) or words["none"]


def with_figure_alt_text(nb: nbformat.NotebookNode, language: str = SOURCE_LANGUAGE) -> nbformat.NotebookNode:
    """NB with alt text on every code cell that outputs an image (the page shows it; the notebook is unchanged).

    Names are read as the cells so far define them: a later cell's ``fig_text`` is not an earlier figure's."""
    trees = {}
    for number, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            try:
                trees[number] = ast.parse(cell.source)
            except SyntaxError:
                pass
    functions, env = _functions(list(trees.values())), {}
    for number, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and any(k.startswith("image/") for o in cell.get("outputs", [])
                                            for k in o.get("data", {})):
            image = cell.metadata.setdefault("mystnb", {}).setdefault("image", {})
            image.setdefault("alt", alt_text(cell.source, functions, env, language))
        if number in trees:
            env = _defined(trees[number], env)
    return nb
