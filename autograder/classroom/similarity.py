"""Similarity of answer cells across a class and against the reference solution.

It ranks pairs of answer cells for a person to read; it accuses no one. Each cell is first
brought to its canonical form (``normalise.canonical``: no docstrings, comments, imports or
dead code; one spelling per equivalent call; temporaries used once inlined; local names
erased), then:

* **Subtree fingerprints** (as Dolos and JPlag fingerprint syntax trees): every expression
  and statement subtree of at least ``MIN_SUBTREE`` nodes, hashed bottom-up, as a multiset.
  A pair's score is the Dice coefficient of the two multisets with each subtree weighing its
  size (``WEIGHT_POWER``): two cells that share whole statements score high, two that share
  only the idioms every correct answer has (``softmax(V, -1)``, ``V.mT``) do not.
* **Token winnowing** of the canonical text (as MOSS; Schleimer, Wilkerson and Aiken 2003),
  kept as the pair's second figure (``Pair.tokens``) and to tell a cell too short to rank.

Fingerprints the released stub of that exercise already has (its given ``__init__``,
signature, ``raise NotImplementedError``) are removed first, as MOSS removes a base file's,
so two untouched stubs are not "similar". Cells with fewer than ``MIN_OWN`` subtrees of their
own (a one-line ``causal_mask``, a ``forward`` that calls the given pieces) are not ranked:
every correct answer to them looks alike. ``benchmarks/similarity_accuracy.py`` measures it on
disguised copies (coursekit.disguises) and independent answers of every chapter.

Why not a library: ``copydetect`` (0.5.0 on PyPI; winnowing as MOSS) fingerprints files on
disk, filters them with Pygments into characters (every name, attribute names included,
becomes ``V``, so ``torch.tril`` and ``torch.triu`` look the same) and has no syntax-tree
measure; Dolos is JavaScript. Both measures here work on cell strings with the standard
library, and the pairwise step is one matrix product (numpy): 500 submissions take under a
second (benchmarks/class_report_scale.py).
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .normalise import canonical

K = 5            # tokens per k-gram
WINDOW = 4       # k-grams per winnowing window
MIN_FINGERPRINTS = 6  # a cell with fewer fingerprints of its own is not ranked
WEIGHT_POWER = 1.0  # a shared subtree counts by its size: a shared statement outweighs a shared idiom
MIN_OWN = 15  # subtrees of its own (beyond the stub): fewer, and a cell is not ranked
MIN_SUBTREE = 3  # nodes: smaller subtrees (a name, a constant, x.attr) say nothing
THRESHOLD = 0.6  # pairs at or above this are listed (benchmarks/similarity_accuracy.py: why)
REFERENCE = "(reference solution)"

_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER, tokenize.TYPE_COMMENT}


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def winnow(toks: list[str], k: int = K, window: int = WINDOW) -> set[int]:
    """MOSS's fingerprints: the minimum k-gram hash of every window (position-free)."""
    if len(toks) < k:
        return {_hash(" ".join(toks))} if toks else set()
    grams = [_hash(" ".join(toks[i:i + k])) for i in range(len(toks) - k + 1)]
    if len(grams) <= window:
        return {min(grams)}
    return {min(grams[i:i + window]) for i in range(len(grams) - window + 1)}


def _subtree_hashes(node: ast.AST, out: dict, min_size: int) -> tuple[int, int]:
    """(hash, size) of node's subtree, computed bottom-up; every expression and statement subtree of
    at least min_size nodes counted in out (hash -> how many)."""
    parts = [type(node).__name__]
    size = 1
    for name, value in ast.iter_fields(node):
        if isinstance(value, ast.AST):
            if isinstance(value, (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)):
                parts.append(type(value).__name__)
                continue
            h, n = _subtree_hashes(value, out, min_size)
            parts.append(f"{name}={h}")
            size += n
        elif isinstance(value, list):
            hs = []
            for item in value:
                if isinstance(item, ast.AST):
                    h, n = _subtree_hashes(item, out, min_size)
                    hs.append(str(h))
                    size += n
                else:
                    hs.append(repr(item))
            parts.append(f"{name}=[{','.join(hs)}]")
        else:
            parts.append(f"{name}={value!r}")
    h = _hash(" ".join(parts))
    if isinstance(node, (ast.expr, ast.stmt)) and size >= min_size:
        out[(h, size)] = out.get((h, size), 0) + 1
    return h, size


def subtrees(tree: ast.AST | None, min_size: int = MIN_SUBTREE) -> set[tuple[int, int]]:
    """The canonical tree's subtrees of at least min_size nodes, as a multiset of hashes ((hash, nth))."""
    if tree is None:
        return set()
    counts: dict[tuple[int, int], int] = {}
    _subtree_hashes(tree, counts, min_size)
    return {(h, n, size) for (h, size), c in counts.items() for n in range(c)}


def canonical_tokens(tree: ast.AST | None) -> list[str]:
    """The canonical tree's tokens in order (its names are normalised already)."""
    if tree is None:
        return []
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(ast.unparse(tree)).readline):
            if tok.type not in _SKIP:
                out.append(tokenize.tok_name[tok.type] if tok.type in (tokenize.INDENT, tokenize.DEDENT,
                                                                       tokenize.NEWLINE) else tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError, ValueError, RecursionError):
        pass
    return out


@dataclass
class Fingerprint:
    tokens: set = field(default_factory=set)
    statements: set = field(default_factory=set)  # the canonical tree's subtrees


MAX_CHARS = 100_000  # of one cell: beyond this, a cell is no answer anyone typed


def fingerprint(source: str, base: Fingerprint | None = None, exercise: str | None = None) -> Fingerprint:
    source = source[:MAX_CHARS]
    try:
        tree = canonical(source, exercise)
        fp = Fingerprint(winnow(canonical_tokens(tree)), subtrees(tree))
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


def _weight(item) -> float:
    """A subtree ((hash, nth, size)) weighs its size to the power WEIGHT_POWER; a token fingerprint 1."""
    return float(item[2]) ** WEIGHT_POWER if isinstance(item, tuple) else 1.0


def _dice_matrix(sets: list[set]) -> np.ndarray:
    """(Weighted) Dice coefficient of every pair of sets, by one product of matrices."""
    vocab: dict = {}
    rows, cols = [], []
    for i, s in enumerate(sets):
        for item in s:
            rows.append(i)
            cols.append(vocab.setdefault(item, len(vocab)))
    matrix = np.zeros((len(sets), max(1, len(vocab))), dtype=np.float32)
    matrix[rows, cols] = 1.0
    weights = np.ones(max(1, len(vocab)), dtype=np.float32)
    for item, col in vocab.items():
        weights[col] = _weight(item)
    shared = (matrix * weights) @ matrix.T
    sizes = matrix @ weights
    total = sizes[:, None] + sizes[None, :]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, 2 * shared / total, 0.0)


def combine(by_tokens: np.ndarray, by_subtrees: np.ndarray) -> np.ndarray:
    return by_subtrees


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
        stub = fingerprint(base[exercise], exercise=exercise) if exercise in base else None
        names, sources, fps = [], [], []
        skipped = 0
        seen: dict[str, Fingerprint] = {}  # a class has many identical cells: fingerprint each text once
        for name, answers in sorted(people.items()):
            if exercise not in answers:
                continue
            text = answers[exercise]
            fp = seen.get(text) or seen.setdefault(text, fingerprint(text, stub, exercise))
            if len(fp.tokens) < MIN_FINGERPRINTS or len(fp.statements) < MIN_OWN:
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
        score = combine(by_tokens, by_statements)
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
