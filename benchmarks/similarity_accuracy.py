"""How well the similarity report tells copies from independent work, per chapter.

    .venv/bin/python benchmarks/similarity_accuracy.py                 # held-out half, default threshold
    .venv/bin/python benchmarks/similarity_accuracy.py --half tuning   # the half the measure was tuned on
    .venv/bin/python benchmarks/similarity_accuracy.py --measure /tmp/old_similarity.py   # another version
    .venv/bin/python benchmarks/similarity_accuracy.py --verify        # grade every original, and copies

The data, per chapter: independent correct answers of every exercise (the reference; each correct
style of the chapter's catalog, tests/test_grading_chNN.py CORRECT, whose cell differs from the
reference in more than one line of code; and coursekit.similarity_variants' own), and their
disguised copies (coursekit.disguises: every kind, seeds 0-3; even seeds are the tuning half, odd
seeds the held-out half). Every cell is ranked as the report ranks a class (``rank`` with the
released stubs), all originals and one half's copies together.

* **detected**: a copy scoring at or above the threshold against its original, among the copies
  of originals the report ranks (a copy the report does not rank is a miss);
* **false (independent)**: pairs of independent answers, both ranked, at or above it;
* **false (with copies)**: pairs of cells of different origins (originals and this half's copies),
  both ranked, at or above it: what a class of these learners would see listed.
"""
from __future__ import annotations

import argparse
import ast
import functools
import importlib
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from coursekit import conventions as C  # noqa: E402
from coursekit import disguises as D  # noqa: E402
from coursekit.sample_submissions import reference_answers  # noqa: E402
from coursekit.similarity_variants import independent_solutions  # noqa: E402

SEEDS = (0, 1, 2, 3)
TARGET_DETECTED, TARGET_FALSE = 0.90, 0.02


def _code_lines(source: str) -> list[str]:
    """The cell's code without docstrings and comments, one statement line per line."""
    from autograder.classroom.normalise import _without_docstrings
    tree = ast.parse(source)
    _without_docstrings(tree)
    return [line.strip() for line in ast.unparse(tree).splitlines() if line.strip()]


def _edit_of(a: str, b: str) -> bool:
    """b is a one-line edit of a (the catalogs' styles that change one call of the reference)."""
    import difflib
    la, lb = _code_lines(a), _code_lines(b)
    changed = sum(1 for op in difflib.ndiff(la, lb) if op[:1] in "+-")
    return changed <= 2


@functools.lru_cache(maxsize=None)
def catalog_styles(chapter: str) -> dict[str, dict[str, str]]:
    """style name -> {exercise: answer cell} of the chapter catalog's correct styles."""
    import tempfile

    import nbformat

    from autograder.classroom.similarity import answer_cells
    number = C.chapter_names().index(chapter) + 1
    module = importlib.import_module(f"test_grading_ch{number:02d}")
    styles = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, notebook in module.CORRECT.items():
            if name == "reference":
                continue
            path = Path(tmp) / f"{name}.ipynb"
            nbformat.write(notebook, path)
            styles[name] = answer_cells(path)
    return styles


@functools.lru_cache(maxsize=None)
def originals(chapter: str) -> dict[str, dict[str, str]]:
    """exercise -> {origin: source}: the independent correct answers of every exercise."""
    reference = reference_answers(chapter)
    found = {ex: {"reference": src} for ex, src in reference.items()}
    for style, cells in catalog_styles(chapter).items():
        for ex, src in cells.items():
            if ex in found and not any(_edit_of(other, src) for other in found[ex].values()):
                found[ex][f"catalog:{style}"] = src
    for ex, sources in independent_solutions(chapter).items():
        for i, src in enumerate(sources):
            found.setdefault(ex, {})[f"own:{i + 1}"] = src
    return found


@functools.lru_cache(maxsize=None)
def copies(chapter: str, half: str) -> dict[str, dict[str, tuple[str, str]]]:
    """exercise -> {copy name: (origin, source)} for one half's seeds."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for ex, by_origin in originals(chapter).items():
        for origin, src in by_origin.items():
            for kind in D.KINDS:
                for seed in SEEDS:
                    if D.split(seed) == half:
                        out.setdefault(ex, {})[f"{origin} ~{kind}/{seed}"] = (origin, D.disguise(src, kind, seed))
    return out


def load_measure(path: str | None):
    if path is None:
        from autograder.classroom import similarity
        return similarity
    spec = importlib.util.spec_from_file_location("similarity_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def measure_chapter(chapter: str, half: str = "held-out", threshold: float | None = None, S=None) -> dict:
    from autograder.classroom import similarity as default
    S = S or default
    threshold = S.THRESHOLD if threshold is None else threshold
    stubs = default.stubs(chapter)
    by_exercise = originals(chapter)
    disguised = copies(chapter, half)
    result = {"chapter": chapter, "half": half, "threshold": threshold, "copies": 0, "detected": 0,
              "independent_pairs": 0, "false_independent": 0, "pairs_with_copies": 0, "false_with_copies": 0,
              "not_ranked_originals": 0, "missed": [], "false": [], "highest_independent": 0.0}
    for ex, by_origin in by_exercise.items():
        origin_of = {o: o for o in by_origin}
        cells = {o: {ex: src} for o, src in by_origin.items()}
        for name, (origin, src) in disguised.get(ex, {}).items():
            cells[name] = {ex: src}
            origin_of[name] = origin
        pairs, _ = S.rank(chapter, cells, {ex: stubs[ex]} if ex in stubs else {}, None, threshold=0.0)
        score = {frozenset((p.a, p.b)): p.score for p in pairs}
        ranked = {n for p in pairs for n in (p.a, p.b)}
        for name, origin in origin_of.items():
            if name == origin:
                continue
            if origin not in ranked:
                continue
            s = score.get(frozenset((name, origin)), 0.0) if name in ranked else 0.0
            result["copies"] += 1
            result["detected"] += s >= threshold
            if s < threshold:
                result["missed"].append((ex, name, round(s, 3)))
        names = sorted(origin_of)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if origin_of[a] == origin_of[b] or a not in ranked or b not in ranked:
                    continue
                s = score.get(frozenset((a, b)), 0.0)
                if a in by_origin and b in by_origin:
                    result["independent_pairs"] += 1
                    result["false_independent"] += s >= threshold
                    result["highest_independent"] = max(result["highest_independent"], round(s, 3))
                    if s >= threshold:
                        result["false"].append((ex, a, b, round(s, 3)))
                result["pairs_with_copies"] += 1
                result["false_with_copies"] += s >= threshold
        result["not_ranked_originals"] += sum(o not in ranked for o in by_origin)
    result["originals"] = sum(len(v) for v in by_exercise.values())
    result["detection_rate"] = result["detected"] / max(1, result["copies"])
    result["false_rate"] = result["false_independent"] / max(1, result["independent_pairs"])
    result["false_rate_with_copies"] = result["false_with_copies"] / max(1, result["pairs_with_copies"])
    return result


def measure(half: str = "held-out", threshold: float | None = None, S=None, chapters=None) -> list[dict]:
    return [measure_chapter(ch, half, threshold, S) for ch in (chapters or C.chapter_names())]


def meets_target(row: dict) -> bool:
    return row["detection_rate"] >= TARGET_DETECTED and row["false_rate"] <= TARGET_FALSE \
        and row["false_rate_with_copies"] <= TARGET_FALSE


def table(rows: list[dict]) -> str:
    lines = [f"{'chapter':24} {'answers':>7} {'unranked':>8} {'detected':>16} {'false (independent)':>20} "
             f"{'false (with copies)':>21} {'highest ind.':>12}"]
    for r in rows:
        lines.append(f"{r['chapter']:24} {r['originals']:7d} {r['not_ranked_originals']:8d} "
                     f"{r['detected']:5d}/{r['copies']:<5d} {r['detection_rate']:5.1%} "
                     f"{r['false_independent']:4d}/{r['independent_pairs']:<5d} {r['false_rate']:6.1%}   "
                     f"{r['false_with_copies']:5d}/{r['pairs_with_copies']:<6d} {r['false_rate_with_copies']:6.1%} "
                     f"{r['highest_independent']:12.2f}")
    return "\n".join(lines)


def verify(chapters) -> int:
    """Grade (in process) every original and one copy of each kind per half: each must keep full marks."""
    import os
    import tempfile

    import nbformat

    from autograder.inprocess import grade_forked
    from coursekit.sample_submissions import submission
    os.environ.setdefault("MPLBACKEND", "Agg")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for chapter in chapters:
            paths = {}
            by_exercise = originals(chapter)
            names = sorted({o for v in by_exercise.values() for o in v})
            for origin in names:
                answers = {ex: v[origin] for ex, v in by_exercise.items() if origin in v}
                variants = {"": answers, **{f"{k}/{s}": {ex: D.disguise(src, k, s) for ex, src in answers.items()}
                                            for k in D.KINDS for s in SEEDS[:2]}}
                for label, cells in variants.items():
                    path = Path(tmp) / f"{chapter}-{len(paths)}.ipynb"
                    nbformat.write(submission(cells, chapter=chapter), path)
                    paths[path] = f"{origin} {label}"
            for (path, label), r in zip(paths.items(), grade_forked(list(paths))):
                if r.get("score") != r.get("max_score") or "error" in r:
                    failures += 1
                    lost = {o["test_id"]: [v["message"] for v in o["verdicts"]]
                            for o in r.get("outcomes", []) if o["verdicts"]}
                    print(f"FAILED {chapter} {label}: {r.get('error', '')} {json.dumps(lost)[:600]}")
            print(f"{chapter}: {len(paths)} notebooks graded", flush=True)
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--half", choices=("held-out", "tuning"), default="held-out")
    parser.add_argument("--threshold", type=float, default=None)
    parser.add_argument("--measure", help="a similarity module's file to measure instead of the report's own")
    parser.add_argument("--chapter", action="append", help="only these chapters (repeatable)")
    parser.add_argument("--show", action="store_true", help="list every miss and false positive")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--verify", action="store_true", help="grade the originals and copies instead")
    args = parser.parse_args()
    chapters = args.chapter or C.chapter_names()
    if args.verify:
        sys.exit(1 if verify(chapters) else 0)
    S = load_measure(args.measure)
    rows = measure(args.half, args.threshold, S, chapters)
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{args.half} half, threshold {rows[0]['threshold']}, measure {args.measure or 'the report'}")
    print(table(rows))
    total_c = sum(r["copies"] for r in rows)
    total_p = sum(r["independent_pairs"] for r in rows)
    print(f"{'all':24} detected {sum(r['detected'] for r in rows)}/{total_c} "
          f"{sum(r['detected'] for r in rows) / max(1, total_c):.1%}; false (independent) "
          f"{sum(r['false_independent'] for r in rows)}/{total_p}; every chapter on target: "
          f"{all(meets_target(r) for r in rows)}")
    if args.show:
        for r in rows:
            for m in r["missed"]:
                print("missed", r["chapter"], m)
            for f in r["false"]:
                print("false", r["chapter"], f)


if __name__ == "__main__":
    main()
