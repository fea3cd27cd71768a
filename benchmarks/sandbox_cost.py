"""What the OS sandbox costs per notebook: the same full-marks notebook graded with and without it.

    .venv/bin/python benchmarks/sandbox_cost.py [--runs 5] [--chapter 02_self_attention]

Paired runs, each a fresh ``python -m autograder grade NB --json`` process, alternating
sandboxed and ``--unsandboxed`` so that both see the same machine load. Prints the medians,
the median of the per-pair differences (the sandbox's cost per notebook), and which
enforcement of the limits the sandboxed runs reported.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(argv) -> tuple[float, dict]:
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--chapter", default="02_self_attention")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from coursekit.sample_submissions import submission

    notebook = Path(tempfile.mkdtemp()) / f"{args.chapter}.ipynb"
    nbformat.write(submission(chapter=args.chapter), notebook)
    grade = [sys.executable, "-m", "autograder", "grade", str(notebook), "--json"]
    timed(grade)  # build the cached course template once
    sandboxed, plain, scores = [], [], set()
    for _ in range(args.runs):
        seconds, result = timed(grade)
        sandboxed.append(seconds)
        scores.add(result["score"])
        seconds, result = timed(grade + ["--unsandboxed"])
        plain.append(seconds)
        scores.add(result["score"])
    med = statistics.median
    print(f"chapter {args.chapter}, {args.runs} pairs, fresh process each, scores {sorted(scores)}")
    print(f"sandboxed:   median {med(sandboxed):.2f} s  ({', '.join(f'{s:.2f}' for s in sandboxed)})")
    print(f"unsandboxed: median {med(plain):.2f} s  ({', '.join(f'{s:.2f}' for s in plain)})")
    print(f"sandbox cost per notebook (median of paired differences): "
          f"{med(s - p for s, p in zip(sandboxed, plain)):+.2f} s")


if __name__ == "__main__":
    main()
