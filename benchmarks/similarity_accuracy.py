"""Detection and false-positive rates of the similarity report at several thresholds.

    .venv/bin/python benchmarks/similarity_accuracy.py [THRESHOLD ...]

On Chapter 2: the sample class's "ben" and the reference, each disguised four ways
(renamed, reordered, recommented, all three), and three independent correct solutions
of every exercise (coursekit.similarity_variants). A detection is a copy scoring at or
above the threshold against its original; a false positive is an independent solution
doing so against the reference, another independent solution or any copy.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursekit.similarity_variants import measure  # noqa: E402


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
