"""One execution of a chapter for both editions of the book.

The two editions' notebooks differ, cell for cell, only in their strings (and comments), apart
from the setup cell, where the translation also picks its figure font. So the book runs each
chapter once: ``run_source`` rewrites a code cell of the English run so that each string the two
editions write differently evaluates both (``bilingual_kernel.both``), and every f-string
formats each language's view of its values (``bilingual_kernel.formatted``) in the same scope at
the same moment: the numbers the translated page prints are those of the English page. A cell
whose two versions differ in more than strings runs as the English one.

``translated`` then makes the translated edition's outputs from the run's: printed text, shown
values and glued strings through the run's table of English and translated strings, and each
figure as the kernel drew it a second time, translated (``bilingual_kernel``).
"""
from __future__ import annotations

import ast
import base64
import copy
import hashlib
import html
from pathlib import Path

from .bilingual_kernel import translated_text

KERNEL_MODULE = Path(__file__).with_name("bilingual_kernel.py")
LITERAL, BOTH, FORMATTED, CALLED, JOINED = "_tr_text", "_tr_both", "_tr_format", "_tr_call", "_tr_join"
VALUES = "_tr_v"  # the argument of the lambda that formats an f-string's values in both templates
# The chapters' helpers that pad text to a width in columns: called through ``called`` wherever they
# are (any call in an f-string's value is), so each language gets its own padding.
TEXT_HELPERS = {"pad_to", "pad"}


def _strings_erased(tree: ast.AST) -> str:
    tree = copy.deepcopy(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
        elif isinstance(node, ast.JoinedStr):
            node.values = []
    return ast.dump(tree)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of docstring nodes (kept as they are: a call there would be no docstring)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _call(name: str, args: list[ast.expr]) -> ast.Call:
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=args, keywords=[])


def _calls_per_language(expression: ast.expr) -> ast.expr:
    """EXPRESSION with each function call made through ``called`` (run once per language's view)."""
    class Calls(ast.NodeTransformer):
        def visit_Call(self, node):
            self.generic_visit(node)
            if isinstance(node.func, ast.Name) and node.func.id in (LITERAL, BOTH, FORMATTED, CALLED, JOINED):
                return node
            return ast.Call(func=ast.Name(id=CALLED, ctx=ast.Load()), args=[node.func, *node.args],
                            keywords=node.keywords)
    return Calls().visit(expression)


class _Rewrite:
    def __init__(self, english: ast.AST):
        self.docstrings = _docstrings(english)

    def node(self, en, tr):
        """EN rewritten; TR is its counterpart in the translation (EN itself when there is none)."""
        if isinstance(en, ast.JoinedStr):
            other = tr if isinstance(tr, ast.JoinedStr) else en
            if ast.dump(other) == ast.dump(en):
                return self.fstring(en, en, other)
            # Two templates, one evaluation: each value (a timer, a random draw) is computed once, in
            # the f-string's own scope, and both templates format it (a lambda reads only its argument).
            values: list[ast.expr] = []
            shared: dict[int, ast.Subscript] = {}
            pair = [self.fstring(template, en, other, values, shared) for template in (en, other)]
            build = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=VALUES)], kwonlyargs=[],
                                                  kw_defaults=[], defaults=[]), body=_call(BOTH, pair))
            return ast.Call(func=build, args=[ast.Tuple(elts=values, ctx=ast.Load())], keywords=[])
        if (isinstance(en, ast.Constant) and isinstance(en.value, str) and isinstance(tr, ast.Constant)
                and isinstance(tr.value, str) and en.value != tr.value and id(en) not in self.docstrings):
            return _call(LITERAL, [en, tr])
        if isinstance(en, (ast.MatchValue, ast.MatchSingleton, ast.MatchMapping)):
            return en  # patterns must stay literals
        for field, value in ast.iter_fields(en):
            other = getattr(tr, field, None)
            if isinstance(value, list):
                others = other if isinstance(other, list) and len(other) == len(value) else value
                setattr(en, field, [self.node(v, o) if isinstance(v, ast.AST) else v for v, o in zip(value, others)])
            elif isinstance(value, ast.AST):
                setattr(en, field, self.node(value, other if isinstance(other, ast.AST) else value))
        if isinstance(en, ast.Call) and isinstance(en.func, ast.Name) and en.func.id in TEXT_HELPERS:
            return ast.Call(func=ast.Name(id=CALLED, ctx=ast.Load()), args=[en.func, *en.args], keywords=en.keywords)
        if (isinstance(en, ast.Call) and isinstance(en.func, ast.Attribute) and en.func.attr == "join"
                and len(en.args) == 1 and not en.keywords and not isinstance(en.args[0], ast.Starred)):
            return _call(JOINED, [en.func.value, en.args[0]])  # a str's join, or anything else's (joined calls it)
        return en

    def fstring(self, template: ast.JoinedStr, en: ast.JoinedStr, tr: ast.JoinedStr,
                values: list | None = None, shared: dict | None = None) -> ast.Call:
        """TEMPLATE (the English or the translated f-string) as a call of ``formatted``.

        Its values are the English code's expressions (EN's, rewritten against TR's), so that the
        translation's text formats the values the run has: a translated key or label in them
        would name nothing in the English run. A value written differently (not only in its
        strings) stays the template's own. With VALUES, each expression is appended there and read
        back as ``_tr_v[i]``; a value both templates take from the English code is appended once
        (SHARED, by its position), and so is a format spec both write alike.
        """
        def kept(expression, position=None):
            if values is None:
                return expression
            if position is not None and position in shared:
                return shared[position]
            values.append(expression)
            read = ast.Subscript(value=ast.Name(id=VALUES, ctx=ast.Load()), slice=ast.Constant(len(values) - 1),
                                 ctx=ast.Load())
            if position is not None:
                shared[position] = read
            return read

        own = [v for v in template.values if isinstance(v, ast.FormattedValue)]
        english_values = [v for v in en.values if isinstance(v, ast.FormattedValue)]
        others = [v for v in tr.values if isinstance(v, ast.FormattedValue)]
        paired = len(own) == len(english_values) == len(others)
        if not paired:
            english_values = others = own
        pairs = iter(enumerate(zip(own, english_values, others)))
        args = []
        for part in template.values:
            if isinstance(part, ast.FormattedValue):
                position, (mine, value, other) = next(pairs)
                same = _strings_erased(value.value) == _strings_erased(other.value)
                expression = self.node(copy.deepcopy(value.value), other.value) if same else mine.value
                expression = kept(_calls_per_language(expression), position if same and paired else None)
                same_spec = paired and ast.dump(value.format_spec or ast.Constant("")) == \
                    ast.dump(other.format_spec or ast.Constant(""))
                spec = (kept(self.fstring(mine.format_spec, mine.format_spec, mine.format_spec),
                             ("spec", position) if same_spec else None) if mine.format_spec else ast.Constant(""))
                args.append(ast.Tuple(elts=[expression, ast.Constant(mine.conversion), spec], ctx=ast.Load()))
            else:
                args.append(part)
        return _call(FORMATTED, args)


def run_source(english: str, translation: str) -> str:
    """The code the single run executes for one cell (the English cell when no rewrite applies)."""
    try:
        en, tr = ast.parse(english), ast.parse(translation)
    except SyntaxError:
        return english
    if _strings_erased(en) != _strings_erased(tr):
        tr = en  # more than strings differ (the setup cell): the English code, its f-strings still formatted
    rewritten = _Rewrite(en).node(en, tr)
    return ast.unparse(ast.fix_missing_locations(rewritten))


def prelude(fonts: list[str], record_file: str) -> str:
    """The first cell of the run: load the kernel side and install it."""
    return ("import importlib.util as _ilu\n"
            f"_spec = _ilu.spec_from_file_location('bilingual_kernel', {str(KERNEL_MODULE)!r})\n"
            "_bilingual = _ilu.module_from_spec(_spec)\n"
            "_spec.loader.exec_module(_bilingual)\n"
            f"_bilingual.install(globals(), {list(fonts)!r}, {record_file!r})\n"
            "del _ilu, _spec")


class Translator:
    """The translated edition's outputs from the run's, with what the run recorded."""

    def __init__(self, record: dict):
        self.table = dict(record["table"])
        self.figures = record["figures"]

    def text(self, text: str, escape=False) -> str:
        if escape:  # in HTML, as the page holds it
            return translated_text(text, {html.escape(k, quote=False): html.escape(v, quote=False)
                                          for k, v in self.table.items()})
        return translated_text(text, self.table)

    def figure(self, png_base64: str) -> dict | None:
        data = png_base64 if isinstance(png_base64, str) else "".join(png_base64)
        return self.figures.get(hashlib.sha256(base64.b64decode(data)).hexdigest())

    def output(self, output: dict) -> tuple[dict, list[str] | None]:
        """One output in the translation, and the strings its figure draws (None if it is no figure)."""
        output = copy.deepcopy(output)
        drawn = None
        if output.get("output_type") == "stream":
            output["text"] = self.text(output["text"])
        for mime, value in list(output.get("data", {}).items()):
            if mime == "image/png":
                figure = self.figure(value)
                if figure is not None:
                    output["data"][mime] = figure["image"]
                    output.get("metadata", {}).pop(mime, None)  # its size is the English image's
                    drawn = figure["text"]
            elif mime in ("text/plain", "text/markdown", "text/latex"):
                output["data"][mime] = self.text(value if isinstance(value, str) else "".join(value))
            elif mime == "text/html":
                output["data"][mime] = self.text(value if isinstance(value, str) else "".join(value), escape=True)
        return output, drawn
