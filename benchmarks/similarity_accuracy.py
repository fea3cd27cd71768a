"""Detection and false-positive rates of the similarity report at several thresholds.

    .venv/bin/python benchmarks/similarity_accuracy.py [THRESHOLD ...]

On Chapter 2: the sample class's "ben" and the reference, each disguised four ways
(renamed, reordered, recommented, all three), and three independent correct solutions
of every exercise (coursekit.similarity_variants, the data; ``measure`` here). A detection is a copy scoring at or
above the threshold against its original; a false positive is an independent solution
doing so against the reference, another independent solution or any copy.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autograder.classroom import similarity as S  # noqa: E402
from coursekit import conventions as C  # noqa: E402
from coursekit.sample_submissions import reference_answers  # noqa: E402
from coursekit.similarity_variants import CHAPTER, INDEPENDENT, disguised, independent_sets  # noqa: E402


def measure(threshold: float) -> dict:
    """Detection and false-positive rates of autograder.classroom.similarity at threshold, on Chapter 2.

    Originals: the reference and the sample class's "ben" (the reference with two
    mistakes of his own). Copies: every disguise of each original. A detection is an
    (original, its copy) pair at or above threshold; a false positive is a pair of an
    independent solution with the reference, another independent solution or any copy.
    Counted per exercise cell that the report ranks (cells too short to rank are left out
    and counted apart).
    """
    reference = reference_answers(CHAPTER)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(C.ROOT / "examples" / "sample_class.py"), tmp], check=True,
                       capture_output=True)
        ben = S.answer_cells(Path(tmp) / "submitted" / "ben" / CHAPTER / f"{CHAPTER}.ipynb")
    originals = {"reference": reference, "ben": ben}
    cells = dict(originals)
    copies = {}
    for owner, answers in originals.items():
        for disguise, variant in disguised(answers).items():
            cells[f"{owner} {disguise}"] = variant
            copies[f"{owner} {disguise}"] = owner
    independent = [f"independent {i + 1}" for i in range(len(independent_sets()))]
    cells.update(zip(independent, independent_sets()))
    base = S.answer_cells(C.learner_notebook(CHAPTER))
    pairs, stats = S.rank(CHAPTER, cells, base, None, threshold=0.0)
    score = {(p.exercise, frozenset((p.a, p.b))): p.score for p in pairs}
    ranked = {(p.exercise, n) for p in pairs for n in (p.a, p.b)}
    hits = misses = fp = negatives = 0
    missed, false = [], []
    for exercise in INDEPENDENT:
        for copy, owner in copies.items():
            if (exercise, copy) in ranked and (exercise, owner) in ranked:
                s = score.get((exercise, frozenset((copy, owner))), 0.0)
                hits += s >= threshold
                misses += s < threshold
                if s < threshold:
                    missed.append((exercise, copy, round(s, 2)))
        others = ["reference", *independent, *copies]
        for ind in independent:
            for other in others:
                if other == ind or (other in independent and other < ind):
                    continue
                if (exercise, ind) in ranked and (exercise, other) in ranked:
                    s = score.get((exercise, frozenset((ind, other))), 0.0)
                    negatives += 1
                    fp += s >= threshold
                    if s >= threshold:
                        false.append((exercise, ind, other, round(s, 2)))
    return {"threshold": threshold, "copies": hits + misses, "detected": hits,
            "detection_rate": hits / max(1, hits + misses), "independent_pairs": negatives,
            "false_positives": fp, "false_positive_rate": fp / max(1, negatives),
            "missed": missed, "false": false, "not_ranked": {e: s["not ranked"] for e, s in stats.items()},
            "scores": json.dumps({f"{e}: {' ~ '.join(sorted(k))}": round(v, 2) for (e, k), v in score.items()})}


def main() -> None:
    thresholds = [float(t) for t in sys.argv[1:]] or [0.5, 0.6, 0.7, 0.75, 0.8, 0.9]
    print(f"{'threshold':>9}  {'detected':>12}  {'false positives':>16}")
    for threshold in thresholds:
        r = measure(threshold)
        print(f"{threshold:9.2f}  {r['detected']:4d}/{r['copies']:<4d} {r['detection_rate']:4.0%}  "
              f"{r['false_positives']:5d}/{r['independent_pairs']:<4d} {r['false_positive_rate']:5.1%}")
        for missed in r["missed"]:
            print(f"{'':11}missed: {missed}")
        for false in r["false"]:
            print(f"{'':11}false positive: {false}")


if __name__ == "__main__":
    main()
