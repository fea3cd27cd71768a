"""Time grading one Chapter 2 notebook against the floor of just executing it.

    .venv/bin/python benchmarks/grade_one.py [--runs 5]

Prints the median wall time of `python -m autograder grade NB --json` (a fresh process
each run, as an instructor would call it), of `grade()` in a warm process, and of one
plain nbclient execution of the same notebook in a fresh kernel.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from conftest import submission
    from autograder.grading import grade
    from autograder.submission import repaired

    tmp = Path(tempfile.mkdtemp())
    path = tmp / "02_self_attention.ipynb"
    nb = submission()
    nbformat.write(nb, path)
    grade(path)  # build the cached course template once

    cli = []
    for _ in range(args.runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "autograder", "grade", str(path), "--json"], cwd=ROOT,
                       check=True, capture_output=True)
        cli.append(time.perf_counter() - started)
    warm = []
    for _ in range(args.runs):
        started = time.perf_counter()
        grade(path)
        warm.append(time.perf_counter() - started)
    floor = []
    for _ in range(args.runs):
        plain = repaired(nb, nb)[0]  # the cells grading runs, without hidden tests
        started = time.perf_counter()
        NotebookClient(plain, timeout=600, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(tmp)}}).execute()
        floor.append(time.perf_counter() - started)
    med = statistics.median
    print(f"grade via CLI (fresh process), median of {args.runs}: {med(cli):.2f} s")
    print(f"grade() in a warm process,     median of {args.runs}: {med(warm):.2f} s")
    print(f"floor: nbclient executes the same notebook once, median of {args.runs}: {med(floor):.2f} s")
    print(f"ratio warm grade / floor: {med(warm) / med(floor):.2f}")


if __name__ == "__main__":
    main()
