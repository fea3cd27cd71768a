"""What a reader or learner reads, found in a chapter's cells, and put back translated.

A translation never touches code: only these units are looked up in a catalog, and
everything around them is kept byte for byte.

* markdown: each block (paragraphs, lists, tables, admonitions and dropdowns as a
  whole, split at blank lines outside fences) that holds words outside math and code;
* figure text: the string values of the one dict per figure (``NAME_TEXT = dict(...)``,
  ``FIG_NAME = dict(...)``, ``text = {...}``), nested dicts and lists included;
* figure text written in place: matplotlib titles, axis labels, tick labels, legend
  labels and notes;
* printed text: every string that reaches ``print(...)`` (through ``+``, ``%``,
  ``.format``, ``.join`` and conditional expressions);
* messages: ``assert`` messages and the first argument of ``raise Error(...)``;
* comments and docstrings of every cell a reader sees (given code, exports, exercise
  stubs and visible tests), except inside a solution and except tool pragmas.

A string literal's unit is the text between its quotes as written (escapes and
f-string ``{fields}`` included), so the translation keeps them and the cell still parses.
A literal is one unit even where two rules find it (a ``title=`` inside a figure-text
dict): translating it twice would glue two copies into one implicit concatenation.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import tokenize

from coursekit.conventions import SOLUTION_BEGIN, SOLUTION_END

TEXT_FIRST_ARGUMENT = {"set_title", "set_xlabel", "set_ylabel", "suptitle", "set_text", "annotate",
                       "title", "xlabel", "ylabel", "supxlabel", "supylabel", "set_xticklabels",
                       "set_yticklabels", "set_label"}
TEXT_KEYWORDS = {"label", "title", "xlabel", "ylabel", "s", "labels", "titles"}
TICKS = {"set_xticks", "set_yticks", "xticks", "yticks"}
FIGURE_TEXT = re.compile(r"^(?:(?:\w*_)?(?:TEXT|text)|FIG_[A-Z0-9_]+)$")
PRAGMA = re.compile(r"^#\s*(?:noqa|type:|pragma|fmt:|pylint:)")
_WORD = re.compile(r"[A-Za-z]{2,}")
# Words in a formula's \text{...} that read as a phrase ("for every ", " seen", "bytes per number"),
# not a name ("mask", "logits"): a reader reads them, so the formula is translated.
TEXT_IN_MATH_PROSE = re.compile(r"\\text\{[^{}]*(?:[A-Za-z]{2,} |\s[A-Za-z]{2,})[^{}]*\}")
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
    if first.startswith(("$$", "\\begin{")):
        return bool(TEXT_IN_MATH_PROSE.search(block))  # a display formula: prose only in its \text{...} words
    if re.match(r"^(`{3,}|~{3,})(?!\{)", first):
        return False  # a code block
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
            if isinstance(node.value, (ast.Dict, ast.Call)):  # a dict of figure text, not a prompt
                found += [(n, "string") for n in _figure_text_values(node.value)]
        elif isinstance(node, ast.Call):
            found += [(n, "string") for n in _figure_or_printed_text(node)]
        elif isinstance(node, ast.Assert) and node.msg is not None:
            found += [(n, "string") for n in _reached_text(node.msg)]
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            found += [(n, "string") for n in _reached_text(node.exc.args[0])]
        if isinstance(
                node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            if node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
                    and isinstance(node.body[0].value.value, str):
                found.append((node.body[0].value, "docstring"))
    return [(n, k) for n, k in found if isinstance(n, (ast.Constant, ast.JoinedStr))
            and not (isinstance(n, ast.Constant) and not isinstance(n.value, str))]


def _figure_text_values(value: ast.expr) -> list[ast.expr]:
    """The strings of a figure-text dict: its values, nested dicts and lists included."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        return [n for k in value.keywords for n in _figure_text_values(k.value)]
    if isinstance(value, ast.Dict):
        return [n for v in value.values for n in _figure_text_values(v)]
    if isinstance(value, (ast.List, ast.Tuple)):
        return [n for v in value.elts for n in _figure_text_values(v)]
    return _reached_text(value)


def _reached_text(node: ast.expr) -> list[ast.expr]:
    """The string literals whose text ends up in the value of NODE (not keys, not code)."""
    if isinstance(node, (ast.Constant, ast.JoinedStr)):
        return [node]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _reached_text(node.left) + _reached_text(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _reached_text(node.left)
    if isinstance(node, ast.IfExp):
        return _reached_text(node.body) + _reached_text(node.orelse)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [n for e in node.elts for n in _reached_text(e)]
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return _reached_text(node.elt)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format":
            return _reached_text(node.func.value)
        if node.func.attr == "join" and node.args:
            return _reached_text(node.args[0])
    return []


def _figure_or_printed_text(call: ast.Call) -> list[ast.expr]:
    """Text a call prints or draws: what reaches print, matplotlib's titles, labels, ticks and notes."""
    name = call.func.id if isinstance(call.func, ast.Name) else \
        call.func.attr if isinstance(call.func, ast.Attribute) else ""
    if name == "print":
        return [n for a in call.args for n in _reached_text(a)]
    found = [n for k in call.keywords if k.arg in TEXT_KEYWORDS for n in _reached_text(k.value)]
    if name in TEXT_FIRST_ARGUMENT and call.args:
        found += _reached_text(call.args[0])
    if name == "text" and len(call.args) >= 3:
        found += _reached_text(call.args[2])
    if name in TICKS and len(call.args) >= 2:
        found += _reached_text(call.args[1])
    if name == "legend" and call.args:
        found += _reached_text(call.args[-1] if len(call.args) == 2 else call.args[0])
    return found


FIELD_LITERAL = re.compile(r"""(?:^|(?<=[\s(,{]))(['"])((?:(?!\1)[^{}\\])*)\1(?!\s*\])""")


def shown_text(body: str) -> str:
    """A string unit's text as shown: f-string fields dropped, except the literals a field
    shows (``{'layers':>8}``, ``{'yes' if w else 'no'}``), which are text like the rest."""
    return re.sub(r"\{([^{}]*)\}", lambda m: " ".join(g[1] for g in FIELD_LITERAL.findall(m.group(1))), body)


def _string_tokens(source: str) -> list[tokenize.TokenInfo]:
    return [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.STRING]


_QUOTED = re.compile(r"^(?P<prefix>[rRbBuUfF]*)(?P<quote>'''|\"\"\"|'|\")(?P<body>.*)(?P=quote)$", re.S)


def code_spans(source: str, cell_kind: str, labels: frozenset[str] = frozenset()) -> list[Span]:
    """The translatable units of one code cell, in order (LABELS: see ``chapter_labels``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines, offsets = source.split("\n"), _offsets(source)
    tokens = _string_tokens(source)

    def at(row, col):
        return offsets[row - 1] + col

    spans: list[Span] = []
    seen: set[tuple[int, int]] = set()
    for node, kind in _literal_nodes(tree, cell_kind):
        if (node.lineno, node.col_offset) in seen:
            continue  # found twice (e.g. ``title=`` inside a figure-text dict): one unit, rebuilt once
        seen.add((node.lineno, node.col_offset))
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
        if not _WORD.search(shown_text(body)):
            continue
        prefix = ("f" if is_f else "") + ("r" if "r" in quoted[0]["prefix"].lower() else "")
        spans.append(Span(start, end, body, "string", prefix + quoted[0]["quote"]))
    if cell_kind == "code" and labels:
        taken = {s.start for s in spans}
        for token in tokens:
            quoted = _QUOTED.match(token.string)
            if quoted and quoted["prefix"].lower() in ("", "r") and quoted["body"] in labels:
                start = at(*token.start)
                if start not in taken:
                    spans.append(Span(start, at(*token.end), quoted["body"], "string",
                                      quoted["prefix"] + quoted["quote"]))
    spans += _visible_comments(source, offsets)
    if cell_kind == "exercise":
        hidden = _solution_regions(source, offsets)
        spans = [s for s in spans if not any(a <= s.start < b for a, b in hidden)]
    return sorted(spans, key=lambda s: s.start)


def _solution_regions(source: str, offsets: list[int]) -> list[tuple[int, int]]:
    """Character ranges of the solutions: learners never see them (the stub replaces them)."""
    regions, begin = [], None
    for number, line in enumerate(source.split("\n")):
        if line.strip() == SOLUTION_BEGIN:
            begin = offsets[number]
        elif line.strip() == SOLUTION_END and begin is not None:
            regions.append((begin, offsets[number + 1]))
            begin = None
    return regions


def _visible_comments(source: str, offsets: list[int]) -> list[Span]:
    """Comments a reader sees: not the solution markers, not the solution's, not tool pragmas."""
    spans, inside = [], False
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        text = token.string
        if text.strip() == SOLUTION_BEGIN:
            inside = True
        elif text.strip() == SOLUTION_END:
            inside = False
        elif not inside and _WORD.search(text) and not PRAGMA.match(text):
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


def translate_code(source: str, cell_kind: str, lookup, labels: frozenset[str] = frozenset()) -> str:
    """SOURCE with every unit replaced by ``lookup(unit)`` (None keeps the English)."""
    out, last = [], 0
    for span in code_spans(source, cell_kind, labels):
        translation = lookup(span.text)
        if translation is None or span.start < last:  # a span inside one already replaced
            continue
        out += [source[last:span.start], _rebuilt(span, translation)]
        last = span.end
    out.append(source[last:])
    text = "".join(out)
    for label in labels if cell_kind == "code" else ():  # the same key inside an f-string's {fields}
        translation = lookup(label)
        if translation:
            text = re.sub(r"""(?<=[\[{(,\s])(['"])""" + re.escape(label) + r"\1",
                          lambda m: m.group(1) + translation + m.group(1), text)
    return text


def translate_markdown(text: str, lookup) -> str:
    blocks = markdown_blocks(text)
    return "\n\n".join((lookup(b) if is_prose(b) else None) or b for b in blocks)


def units(kind: str, source: str, labels: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """(msgid, unit kind) of one cell, in order; unit kinds: markdown, string, docstring, comment."""
    if kind == "markdown":
        return [(b, "markdown") for b in markdown_blocks(source) if is_prose(b)]
    if kind == "written":  # all of it a solution region (model answer, rubric): kept out of catalogs
        return []
    return [(s.text, s.kind) for s in code_spans(source, kind, labels)]


_LABEL_WORD = re.compile(r"[A-Za-z]{3,}")


def chapter_labels(cells) -> frozenset[str]:
    """Labels that given code keeps as data and later draws or prints (as written between
    their quotes): the strings of tuples a ``for`` loop walks (``for name, x in [("no attention", ...), ...]``)
    and of records that pair data with a label (``panels = [(mask, "causal & padding")]``), the
    string keys of dict literals (``{"top-p, p = 0.9": ...}``), and the arguments given to a
    chapter function's parameter named like a title or a label.

    Such a label is a key too (``kept["top-p, p = 0.9"]``), so every quoted copy of it in
    the chapter's given code is translated alike, f-string fields included. A string that
    graded code (exports, exercises, tests, hidden tests) also uses is not a label, nor is a
    one-word dict key or record field (it may be a keyword argument's name or a setting);
    a loop's one-word names are labels (``("attention", True), ("no attention", False)``).
    """
    trees, graded = [], set()
    for cell in cells:
        if cell.kind in ("markdown", "written"):
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        if cell.kind != "code":
            graded.update(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
        else:
            trees.append((cell.source, tree))
    text_params = {}
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                text_params[node.name] = [i for i, a in enumerate(node.args.args)
                                          if a.arg.endswith(("title", "label", "titles", "labels"))]
    found = []
    for source, tree in trees:
        nodes, loop_labels = [], set()
        for node in ast.walk(tree):
            if isinstance(node, ast.For) and isinstance(node.iter, (ast.List, ast.Tuple)):
                loop = [e for t in node.iter.elts if isinstance(t, ast.Tuple) for e in t.elts]
                nodes += loop
                loop_labels.update(id(e) for e in loop)
            elif isinstance(node, (ast.List, ast.Tuple)):  # records that pair data with a label, not vocabularies
                nodes += [e for t in node.elts if isinstance(t, ast.Tuple)
                          and not all(isinstance(x, ast.Constant) for x in t.elts) for e in t.elts]
            elif isinstance(node, ast.Dict):
                nodes += [k for k in node.keys if k is not None]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in text_params:
                nodes += [node.args[i] for i in text_params[node.func.id] if i < len(node.args)]
        for node in nodes:
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or node.value in graded:
                continue
            quoted = _QUOTED.match(ast.get_source_segment(source, node) or "")
            if quoted and quoted["prefix"].lower() in ("", "r") and quoted["quote"] in ("'", '"') \
                    and _LABEL_WORD.search(node.value) \
                    and (id(node) in loop_labels or not re.fullmatch(r"#?[\w.:-]+", node.value)) \
                    and not re.search(r"['\"{}\n]", node.value):
                found.append(quoted["body"])
    return frozenset(found)
