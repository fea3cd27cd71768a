"""Similarity of answer cells across a class and against the reference solution.

It ranks pairs of answer cells for a person to read; it accuses no one. Two measures,
both blind to renamed variables and changed comments, the second also to reordered
statements:

* **Token winnowing** (as MOSS, and Dolos and copydetect after it; Schleimer, Wilkerson
  and Aiken 2003). The cell is parsed, its docstrings dropped and it is unparsed (so
  comments, blank lines and formatting vanish), then tokenized with Python's own
  ``tokenize``: every identifier that is not an attribute name becomes ``V``, every
  number ``N``, every string ``S``; keywords, operators and attribute names (``.softmax``,
  ``.transpose``) stay. The fingerprints are the minimum hashes of every window of
  ``WINDOW`` consecutive ``K``-token hashes.
* **Statement multiset (AST)**. Every statement of the cell, with names and constants
  normalised the same way, is hashed as a whole subtree; the cell is the multiset of
  those hashes, so moving independent statements around leaves it unchanged.

The score of a pair is the larger of the two Dice coefficients (2|A∩B| / (|A|+|B|)).
Fingerprints the released stub of that exercise already has (signature, docstring,
``raise NotImplementedError``) are removed first, as MOSS removes a base file's, so
two untouched stubs are not "similar". Cells with too few fingerprints of their own
(a one-line answer such as ``torch.tril(...)``) are not ranked: every correct answer
to them looks alike.

Why not a library: ``copydetect`` (0.5.0 on PyPI; winnowing as MOSS, the best-kept
package for this) was looked at. It fingerprints files on disk, filters them with
Pygments into characters (every name, attribute names included, becomes ``V``, so
``torch.tril`` and ``torch.triu`` look the same) and hashes character k-grams; it has no
statement-order-insensitive measure and brings jinja2, pygments and tqdm for its own
HTML report. Both measures here are ~100 lines on the standard library, work on cell
strings, keep attribute names (the library calls that tell two answers apart), and the
pairwise step is one matrix product (numpy): 500 submissions take about two seconds.
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import keyword
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

K = 5            # tokens per k-gram
WINDOW = 4       # k-grams per winnowing window
MIN_FINGERPRINTS = 6  # a cell with fewer fingerprints of its own is not ranked
THRESHOLD = 0.6  # pairs at or above this are listed (benchmarks/similarity_accuracy.py: why)
REFERENCE = "(reference solution)"

_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER, tokenize.TYPE_COMMENT}


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _parse(source: str) -> ast.AST | None:
    try:
        return _without_docstrings(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError):
        return None


def tokens(source: str) -> list[str]:
    """The normalised token stream of a cell (identifiers V, numbers N, strings S; no comments)."""
    tree = _parse(source)
    if tree is not None:
        try:
            source = ast.unparse(tree)
        except (ValueError, RecursionError):
            pass
    out: list[str] = []
    previous = ""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in _SKIP:
                continue
            if tok.type == tokenize.NAME:
                text = tok.string if keyword.iskeyword(tok.string) or previous == "." else "V"
            elif tok.type == tokenize.NUMBER:
                text = "N"
            elif tok.type == tokenize.STRING or tokenize.tok_name.get(tok.type, "").startswith("FSTRING"):
                text = "S"
            elif tok.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE):
                text = tokenize.tok_name[tok.type]
            else:
                text = tok.string
            if text == "S" and out and out[-1] == "S":
                continue  # an f-string's parts, or implicitly joined strings: one string
            out.append(text)
            previous = tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a syntax error: the tokens up to it still count
    return out


def winnow(toks: list[str], k: int = K, window: int = WINDOW) -> set[int]:
    """MOSS's fingerprints: the minimum k-gram hash of every window (position-free)."""
    if len(toks) < k:
        return {_hash(" ".join(toks))} if toks else set()
    grams = [_hash(" ".join(toks[i:i + k])) for i in range(len(toks) - k + 1)]
    if len(grams) <= window:
        return {min(grams)}
    return {min(grams[i:i + window]) for i in range(len(grams) - window + 1)}


class _Normalise(ast.NodeTransformer):
    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id="V", ctx=node.ctx), node)

    def visit_arg(self, node):
        node.arg, node.annotation = "V", None
        return node

    def visit_Constant(self, node):
        kind = "S" if isinstance(node.value, (str, bytes)) else "N"
        return ast.copy_location(ast.Constant(value=kind), node)

    def visit_FunctionDef(self, node):
        node.name = "V"
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node.name = "V"
        return self.generic_visit(node)


def statements(source: str) -> set[tuple[int, int]]:
    """The cell's statements as a multiset of normalised subtree hashes (as (hash, nth) pairs)."""
    tree = _parse(source)
    if tree is None:
        return set()
    tree = _Normalise().visit(tree)
    counts: dict[int, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                 ast.ClassDef, ast.Pass)):
            h = _hash(ast.dump(node, annotate_fields=False))
            counts[h] = counts.get(h, 0) + 1
    return {(h, n) for h, c in counts.items() for n in range(c)}


@dataclass
class Fingerprint:
    tokens: set = field(default_factory=set)
    statements: set = field(default_factory=set)


MAX_CHARS = 100_000  # of one cell: beyond this, a cell is no answer anyone typed


def fingerprint(source: str, base: Fingerprint | None = None) -> Fingerprint:
    source = source[:MAX_CHARS]
    try:
        fp = Fingerprint(winnow(tokens(source)), statements(source))
    except (RecursionError, MemoryError, ValueError):  # absurdly nested code: nothing to compare
        fp = Fingerprint()
    if base is not None:
        fp.tokens -= base.tokens
        fp.statements -= base.statements
    return fp


def answer_cells(path: Path, chapter: str | None = None) -> dict[str, str]:
    """grade_id -> source of the notebook's answer (nbgrader solution) cells; {} if unreadable, or if
    its metadata names a chapter other than CHAPTER (the grader refuses such a notebook)."""
    try:
        raw = json.loads(Path(path).read_bytes().decode("utf-8"))
        cells = raw.get("cells", []) if isinstance(raw, dict) else []
        own = raw.get("metadata", {}).get("course", {}).get("chapter") if chapter else None
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return {}
    if isinstance(own, str) and own != chapter:
        from coursekit.conventions import chapter_names
        if own in chapter_names():
            return {}
    found = {}
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = (cell.get("metadata") or {}).get("nbgrader")
        if not isinstance(meta, dict) or not meta.get("solution") or not meta.get("grade_id"):
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        found.setdefault(meta["grade_id"], source)  # a duplicated cell: the first, as grading does
    return found


@dataclass
class Pair:
    chapter: str
    exercise: str
    a: str
    b: str
    score: float
    tokens: float
    statements: float
    source_a: str
    source_b: str


def _dice_matrix(sets: list[set]) -> np.ndarray:
    """Dice coefficient of every pair of sets, by one product of 0/1 matrices."""
    vocab: dict = {}
    rows, cols = [], []
    for i, s in enumerate(sets):
        for item in s:
            rows.append(i)
            cols.append(vocab.setdefault(item, len(vocab)))
    matrix = np.zeros((len(sets), max(1, len(vocab))), dtype=np.float32)
    matrix[rows, cols] = 1.0
    shared = matrix @ matrix.T
    sizes = matrix.sum(axis=1)
    total = sizes[:, None] + sizes[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, 2 * shared / total, 0.0)


def rank(chapter: str, cells: dict[str, dict[str, str]], base: dict[str, str] | None = None,
         reference: dict[str, str] | None = None, threshold: float = THRESHOLD) -> tuple[list[Pair], dict]:
    """Pairs of answer cells at or above threshold, most similar first, per exercise.

    cells: student -> {exercise: source}; base: exercise -> released stub;
    reference: exercise -> reference solution (compared as the pseudo-student REFERENCE).
    Returns the pairs and, per exercise, how many cells were compared and how many skipped.
    """
    base = base or {}
    people = dict(cells)
    if reference:
        people[REFERENCE] = reference
    exercises = sorted({e for answers in people.values() for e in answers})
    pairs: list[Pair] = []
    stats = {}
    for exercise in exercises:
        stub = fingerprint(base[exercise]) if exercise in base else None
        names, sources, fps = [], [], []
        skipped = 0
        seen: dict[str, Fingerprint] = {}  # a class has many identical cells: fingerprint each text once
        for name, answers in sorted(people.items()):
            if exercise not in answers:
                continue
            text = answers[exercise]
            fp = seen.get(text) or seen.setdefault(text, fingerprint(text, stub))
            if len(fp.tokens) < MIN_FINGERPRINTS:
                skipped += 1  # an untouched stub, or too short to tell copying from agreeing
                continue
            names.append(name)
            sources.append(answers[exercise])
            fps.append(fp)
        stats[exercise] = {"compared": len(names), "not ranked": skipped}
        if len(names) < 2:
            continue
        by_tokens = _dice_matrix([f.tokens for f in fps])
        by_statements = _dice_matrix([f.statements for f in fps])
        score = np.maximum(by_tokens, by_statements)
        upper = np.triu(score >= threshold, k=1)
        for i, j in zip(*np.nonzero(upper)):
            a, b = (j, i) if names[j] == REFERENCE else (i, j)  # the reference on the left
            pairs.append(Pair(chapter, exercise, names[a], names[b], float(score[i, j]),
                              float(by_tokens[i, j]), float(by_statements[i, j]), sources[a], sources[b]))
    pairs.sort(key=lambda p: (-p.score, p.exercise, p.a, p.b))
    return pairs, stats


def class_cells(submitted: Path, chapter: str, students: list[str] | None = None) -> dict[str, dict[str, str]]:
    """student -> answer cells of their submission of chapter (submitted/<student>/<chapter>/*.ipynb)."""
    out = {}
    for folder in sorted(Path(submitted).glob(f"*/{chapter}")):
        if students is not None and folder.parent.name not in students:
            continue
        notebooks = sorted(folder.glob("*.ipynb"))
        if notebooks:
            out[folder.parent.name] = answer_cells(notebooks[0], chapter)
    return out


def stubs(chapter: str) -> dict[str, str]:
    """exercise -> the released stub (the learner notebook's answer cell)."""
    from coursekit import conventions as C
    return answer_cells(C.learner_notebook(chapter))


def reference(chapter: str) -> dict[str, str] | None:
    """exercise -> the reference solution (instructor-only; read in the grader's process), if known."""
    from coursekit.sample_submissions import reference_answers
    try:
        return reference_answers(chapter)
    except (OSError, ImportError, ValueError):
        return None


def chapter_pairs(course: Path, chapter: str, threshold: float = THRESHOLD):
    """Rank one chapter of a course folder: its submissions, against each other and the reference."""
    return rank(chapter, class_cells(Path(course) / "submitted", chapter), stubs(chapter), reference(chapter),
                threshold)
