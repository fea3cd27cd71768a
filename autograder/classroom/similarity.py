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

**Shared failures** are what plain similarity cannot see: two submissions that lose points on
the same hidden test with the same named mistake (the grader found both reproduce one mistake
model's wrong values there), rewritten enough to look independent. A failure many in the class
share says nothing of copying, so each weighs its inverse frequency in the class
(``log(graded / sharing)``, as IDF weighs a word), one that at least ``COMMON_SHARE`` of the
graded submissions share weighs nothing, and a pair whose shared failures of one exercise weigh
``SHARED_WEIGHT`` or more is listed with them as its reason (``shared_failures``), whatever the
score of its cells. Listed for a person to read, as every pair here.

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
import itertools
import json
import math
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
COMMON_SHARE = 0.25  # a failure a quarter of the graded submissions share or more is no evidence
SHARED_WEIGHT = math.log(10)  # a pair is listed from this weight on: one failure of a tenth of the class

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


@dataclass(frozen=True)
class Lost:
    """A hidden test a submission lost points on (score below points), and the named mistake its
    verdict gave there: read from the grading record (``class_report.lost_tests``)."""
    test: str
    exercise: str
    score: float
    points: float
    mistake: str


@dataclass
class SharedFailure:
    """What two submissions lost the same way in one exercise."""
    tests: tuple[str, ...]                  # the tests both lost with the same named mistake
    mistakes: tuple[tuple[str, int], ...]   # each shared mistake, with how many submissions made it
    weight: float                           # the sum of the mistakes' inverse-frequency weights
    graded: int                             # graded submissions of the chapter

    def reason(self) -> str:
        made = "; ".join(f"“{m}” ({n} of {self.graded} graded submissions)" for m, n in self.mistakes)
        return f"same wrong result on tests {', '.join(self.tests)}: {made}"


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
    similar: bool = True                  # listed for its score (at or above the threshold)
    ranked: bool = True                   # both cells have enough code of their own to be ranked
    shared: SharedFailure | None = None   # listed (too) for the rare failures both share


def shared_failures(lost: dict[str, list[Lost]], graded: int) -> dict[str, dict[frozenset, SharedFailure]]:
    """exercise -> {frozenset((a, b)): what both lost the same way}, for the pairs whose shared
    failures weigh at least SHARED_WEIGHT.

    lost: student -> the tests their submission lost; graded: the chapter's graded submissions.
    A failure is one test lost with one named mistake; it weighs log(graded / n) for the n
    submissions that have it, and nothing when n is at least COMMON_SHARE of graded. One mistake
    lost on several tests is one bug: it weighs as its rarest shared test, and a pair's weight is
    the sum over the distinct mistakes both made in the exercise.
    """
    who: dict[tuple[str, str, str], set[str]] = {}  # (exercise, mistake, test) -> students
    for student, tests in lost.items():
        for t in tests:
            who.setdefault((t.exercise, t.mistake, t.test), set()).add(student)
    found: dict[tuple, dict] = {}  # (exercise, pair) -> {mistake: [weight, n, tests]}
    for (exercise, mistake, test), students in who.items():
        n = len(students)
        if n < 2 or n >= COMMON_SHARE * graded:
            continue
        weight = math.log(graded / n)
        for a, b in itertools.combinations(sorted(students), 2):
            entry = found.setdefault((exercise, frozenset((a, b))), {}).setdefault(mistake, [0.0, n, set()])
            if weight > entry[0]:
                entry[0], entry[1] = weight, n
            entry[2].add(test)
    out: dict[str, dict[frozenset, SharedFailure]] = {}
    for (exercise, pair), by_mistake in found.items():
        weight = sum(w for w, _, _ in by_mistake.values())
        if weight < SHARED_WEIGHT - 1e-9:  # one failure of exactly a tenth of the class is enough
            continue
        ordered = sorted(by_mistake.items(), key=lambda kv: (kv[1][1], kv[0]))  # the rarest first
        out.setdefault(exercise, {})[pair] = SharedFailure(
            tuple(sorted({t for _, (_, _, ts) in ordered for t in ts})),
            tuple((m, n) for m, (_, n, _) in ordered), weight, graded)
    return out


def _dice(a: set, b: set) -> float:
    """The weighted Dice coefficient of two sets (as _dice_matrix, for one pair)."""
    total = sum(map(_weight, a)) + sum(map(_weight, b))
    return 2 * sum(map(_weight, a & b)) / total if total else 0.0


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
         reference: dict[str, str] | None = None, threshold: float = THRESHOLD,
         shared: dict[str, dict[frozenset, SharedFailure]] | None = None) -> tuple[list[Pair], dict]:
    """Pairs of answer cells at or above threshold, and pairs with shared rare failures, per exercise.

    cells: student -> {exercise: source}; base: exercise -> released stub;
    reference: exercise -> reference solution (compared as the pseudo-student REFERENCE);
    shared: ``shared_failures`` of the class (a pair listed there is listed whatever its score).
    Pairs with both reasons come first, then by score.
    Returns the pairs and, per exercise, how many cells were compared and how many skipped.
    """
    base = base or {}
    shared = shared or {}
    people = dict(cells)
    if reference:
        people[REFERENCE] = reference
    exercises = sorted({e for answers in people.values() for e in answers})
    pairs: list[Pair] = []
    stats = {}
    for exercise in exercises:
        stub = fingerprint(base[exercise], exercise=exercise) if exercise in base else None
        names, sources, fps = [], [], []
        every: dict[str, Fingerprint] = {}  # each cell's fingerprint, ranked or not
        skipped = 0
        seen: dict[str, Fingerprint] = {}  # a class has many identical cells: fingerprint each text once
        for name, answers in sorted(people.items()):
            if exercise not in answers:
                continue
            text = answers[exercise]
            fp = seen.get(text) or seen.setdefault(text, fingerprint(text, stub, exercise))
            every[name] = fp
            if len(fp.tokens) < MIN_FINGERPRINTS or len(fp.statements) < MIN_OWN:
                skipped += 1  # an untouched stub, or too short to tell copying from agreeing
                continue
            names.append(name)
            sources.append(answers[exercise])
            fps.append(fp)
        failing = {p: s for p, s in shared.get(exercise, {}).items() if p <= every.keys()}
        stats[exercise] = {"compared": len(names), "not ranked": skipped, "shared failures": len(failing)}
        listed: dict[frozenset, Pair] = {}
        if len(names) >= 2:
            by_tokens = _dice_matrix([f.tokens for f in fps])
            by_statements = _dice_matrix([f.statements for f in fps])
            score = combine(by_tokens, by_statements)
            upper = np.triu(score >= threshold, k=1)
            for i, j in zip(*np.nonzero(upper)):
                a, b = (j, i) if names[j] == REFERENCE else (i, j)  # the reference on the left
                listed[frozenset((names[a], names[b]))] = Pair(
                    chapter, exercise, names[a], names[b], float(score[i, j]), float(by_tokens[i, j]),
                    float(by_statements[i, j]), sources[a], sources[b])
        ranked = set(names)
        for pair, failure in failing.items():
            if pair not in listed:
                a, b = sorted(pair)
                fa, fb = every[a], every[b]
                by_statements = _dice(fa.statements, fb.statements)
                listed[pair] = Pair(chapter, exercise, a, b, by_statements, _dice(fa.tokens, fb.tokens),
                                    by_statements, people[a][exercise], people[b][exercise],
                                    similar=False, ranked=pair <= ranked)
            listed[pair].shared = failure
        pairs += listed.values()
    pairs.sort(key=lambda p: (-(p.similar + (p.shared is not None)), -p.score, p.exercise, p.a, p.b))
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
