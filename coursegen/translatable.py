"""What a reader or learner reads, found in a chapter's cells, and put back translated.

A translation never touches code: only these units are looked up in a catalog, and
everything around them is kept byte for byte.

* markdown: each block (paragraphs, lists, tables, admonitions and dropdowns as a
  whole, split at blank lines outside fences) that holds words outside math and code;
* figure text: the string values of the one dict per figure (``NAME_TEXT = dict(...)``,
  ``FIG_NAME = dict(...)``);
* figure text written in place: matplotlib titles, axis labels, legend labels and notes;
* printed text: the first argument of ``print(...)``;
* visible tests: assert messages and docstrings;
* stubs: the docstrings and comments learners see in exercise cells.

A string literal's unit is the text between its quotes as written (escapes and
f-string ``{fields}`` included), so the translation keeps them and the cell still parses.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import tokenize

from coursekit.conventions import SOLUTION_BEGIN, SOLUTION_END

TEXT_FIRST_ARGUMENT = {"print", "set_title", "set_xlabel", "set_ylabel", "suptitle", "set_text", "annotate",
                       "title", "xlabel", "ylabel", "supxlabel", "supylabel"}
TEXT_KEYWORDS = {"label", "title", "xlabel", "ylabel"}
FIGURE_TEXT = re.compile(r"^(?:\w*_(?:TEXT|text)|FIG_[A-Z0-9_]+)$")
_WORD = re.compile(r"[A-Za-z]{2,}")
_NOT_PROSE = [re.compile(p, re.S | re.M) for p in (
    r"\$\$.*?\$\$", r"\$[^$\n]+\$", r"`[^`\n]*`", r"\{[a-z:-]+\}", r"\]\([^)]*\)", r"https?://\S+",
    r"^\s*\([\w:-]+\)=[ \t]*$", r"^\s*:[\w-]+:[^\n]*$", r"<!--.*?-->")]


def _fence(line: str) -> str | None:
    """The opening marker of a fenced block (```, ~~~, ::: or $$ on its own line), else None."""
    text = line.strip()
    match = re.match(r"^(`{3,}|~{3,}|:{3,})", text)
    if match:
        return match.group(1)
    if text == "$$" or (text.startswith("$$") and not text.endswith("$$")) or text.startswith("\\begin{"):
        return "$$" if text.startswith("$$") else "\\end{"
    return None


def _closes(line: str, marker: str) -> bool:
    text = line.strip()
    if marker == "$$":
        return text.endswith("$$")
    if marker == "\\end{":
        return text.startswith("\\end{")
    return len(text) >= len(marker) and set(text) == {marker[0]}


def markdown_blocks(text: str) -> list[str]:
    """TEXT split into blocks at blank lines outside fences; ``"\\n\\n".join`` gives it back
    (with runs of blank lines made single)."""
    blocks, current, marker = [], [], None
    for line in text.split("\n"):
        if marker is None and not line.strip():
            if current:
                blocks.append("\n".join(current))
                current = []
            continue
        current.append(line)
        if marker is None:
            opened = _fence(line)
            if opened and not (opened == "$$" and line.strip() != "$$" and line.strip().endswith("$$")):
                marker = opened
        elif _closes(line, marker) and len(current) > 1:
            marker = None
    if current:
        blocks.append("\n".join(current))
    return blocks


def is_prose(block: str) -> bool:
    """Does a markdown block hold words outside math, code, roles, links and directive syntax?"""
    first = block.split("\n", 1)[0].strip()
    if re.match(r"^(`{3,}|~{3,})(?!\{)", first) or first.startswith(("$$", "\\begin{")):
        return False  # a code block or a display formula
    text = block
    for pattern in _NOT_PROSE:
        text = pattern.sub(" ", text)
    text = re.sub(r"[`~:]{3,}", " ", text)
    return bool(_WORD.search(text))


# ------------------------------------------------------------------ code cells

@dataclasses.dataclass(frozen=True)
class Span:
    """A stretch of a code cell, in characters, whose text is one translatable unit."""
    start: int
    end: int
    text: str      # the unit (the msgid)
    kind: str      # "string", "docstring" or "comment"
    prefix: str = ""  # string prefix letters and quote of the literal, to rebuild it
    indent: int = 0   # docstrings: the column continuation lines start at


def _offsets(source: str) -> list[int]:
    starts, total = [0], 0
    for line in source.split("\n"):
        total += len(line) + 1
        starts.append(total)
    return starts


def _char_col(source_lines: list[str], lineno: int, byte_col: int) -> int:
    return len(source_lines[lineno - 1].encode()[:byte_col].decode(errors="ignore"))


def _literal_nodes(tree: ast.AST, cell_kind: str) -> list[tuple[ast.expr, str]]:
    """(string node, kind) pairs of the literals in a cell a reader reads."""
    found: list[tuple[ast.expr, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and FIGURE_TEXT.match(t.id)
                                                 for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
                found += [(k.value, "string") for k in value.keywords]
            elif isinstance(value, ast.Dict):
                found += [(v, "string") for v in value.values]
        elif isinstance(node, ast.Call):
            found += [(n, "string") for n in _figure_or_printed_text(node)]
        elif isinstance(node, ast.Assert) and node.msg is not None and cell_kind == "test":
            found.append((node.msg, "string"))
        if cell_kind in ("exercise", "test") and isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                    and isinstance(node.body[0].value.value, str):
                found.append((node.body[0].value, "docstring"))
    return [(n, k) for n, k in found if isinstance(n, (ast.Constant, ast.JoinedStr))
            and not (isinstance(n, ast.Constant) and not isinstance(n.value, str))]


def _figure_or_printed_text(call: ast.Call) -> list[ast.expr]:
    """Text a call prints or draws: print's first argument, matplotlib's titles, labels and notes."""
    name = call.func.id if isinstance(call.func, ast.Name) else \
        call.func.attr if isinstance(call.func, ast.Attribute) else ""
    found = [k.value for k in call.keywords if k.arg in TEXT_KEYWORDS]
    if name in TEXT_FIRST_ARGUMENT and call.args:
        found.append(call.args[0])
    if name == "text" and len(call.args) >= 3:
        found.append(call.args[2])
    if name == "legend" and call.args and isinstance(call.args[0], (ast.List, ast.Tuple)):
        found += call.args[0].elts
    return found


def _string_tokens(source: str) -> list[tokenize.TokenInfo]:
    return [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.STRING]


_QUOTED = re.compile(r"^(?P<prefix>[rRbBuUfF]*)(?P<quote>'''|\"\"\"|'|\")(?P<body>.*)(?P=quote)$", re.S)


def code_spans(source: str, cell_kind: str) -> list[Span]:
    """The translatable units of one code cell, in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines, offsets = source.split("\n"), _offsets(source)
    tokens = _string_tokens(source)

    def at(row, col):
        return offsets[row - 1] + col

    spans: list[Span] = []
    for node, kind in _literal_nodes(tree, cell_kind):
        start = at(node.lineno, _char_col(lines, node.lineno, node.col_offset))
        end = at(node.end_lineno, _char_col(lines, node.end_lineno, node.end_col_offset))
        parts = [t for t in tokens if start <= at(*t.start) and at(*t.end) <= end]
        quoted = [_QUOTED.match(t.string) for t in parts]
        if not parts or not all(quoted):
            continue
        if kind == "docstring":
            text = inspect.cleandoc(node.value)
            if not _WORD.search(text):
                continue
            spans.append(Span(start, end, text, "docstring", quoted[0]["prefix"] + quoted[0]["quote"],
                              indent=node.col_offset))
            continue
        is_f = any("f" in q["prefix"].lower() for q in quoted)
        body = "".join(q["body"] if ("f" in q["prefix"].lower() or not is_f)
                       else q["body"].replace("{", "{{").replace("}", "}}") for q in quoted)
        if len(quoted) > 1 and len({q["quote"] for q in quoted}) > 1:
            continue  # mixed quotes: leave as written
        if not _WORD.search(re.sub(r"\{[^{}]*\}", "", body)):
            continue
        prefix = ("f" if is_f else "") + ("r" if "r" in quoted[0]["prefix"].lower() else "")
        spans.append(Span(start, end, body, "string", prefix + quoted[0]["quote"]))
    if cell_kind == "exercise":
        spans += _visible_comments(source, offsets)
    return sorted(spans, key=lambda s: s.start)


def _visible_comments(source: str, offsets: list[int]) -> list[Span]:
    """Comments learners see in a stub: not the solution's, not the solution markers."""
    spans, inside = [], False
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        text = token.string
        if text.strip() == SOLUTION_BEGIN:
            inside = True
        elif text.strip() == SOLUTION_END:
            inside = False
        elif not inside and _WORD.search(text):
            start = offsets[token.start[0] - 1] + token.start[1]
            body = text[1:].lstrip()
            spans.append(Span(start + len(text) - len(body), start + len(text), body, "comment"))
    return spans


def _rebuilt(span: Span, translation: str) -> str:
    if span.kind == "comment":
        return translation
    if span.kind == "docstring":
        pad = "\n" + " " * span.indent
        body = translation.replace("\n", pad).replace(pad + "\n", "\n\n").rstrip(" ")
        multiline = "\n" in translation
        quote = span.prefix[-3:] if span.prefix.endswith(('"""', "'''")) else '"""'
        letters = span.prefix.rstrip("'\"")
        return f"{letters}{quote}{body}{pad if multiline else ''}{quote}"
    quote = span.prefix.lstrip("rRfFbBuU")
    return f"{span.prefix}{translation}{quote}"


def translate_code(source: str, cell_kind: str, lookup) -> str:
    """SOURCE with every unit replaced by ``lookup(unit)`` (None keeps the English)."""
    out, last = [], 0
    for span in code_spans(source, cell_kind):
        translation = lookup(span.text)
        if translation is None:
            continue
        out += [source[last:span.start], _rebuilt(span, translation)]
        last = span.end
    out.append(source[last:])
    return "".join(out)


def translate_markdown(text: str, lookup) -> str:
    blocks = markdown_blocks(text)
    return "\n\n".join((lookup(b) if is_prose(b) else None) or b for b in blocks)


def units(kind: str, source: str) -> list[tuple[str, str]]:
    """(msgid, unit kind) of one cell, in order; unit kinds: markdown, string, docstring, comment."""
    if kind == "markdown":
        return [(b, "markdown") for b in markdown_blocks(source) if is_prose(b)]
    return [(s.text, s.kind) for s in code_spans(source, kind)]
