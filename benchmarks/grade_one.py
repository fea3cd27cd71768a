"""Time grading one full-marks Chapter 2 notebook against the least any grader must do.

    .venv/bin/python benchmarks/grade_one.py [--runs 5] [--unsandboxed]

Paired runs, each a fresh process, alternating:
* grade: ``python -m autograder grade NB --json`` (sandboxed unless --unsandboxed);
* floor: a fresh process that starts a kernel with nbclient and runs the cells grading
  must run (imports, the answers, the visible tests; no demo cells), nothing else.
Prints the medians and their ratio (issue 8's target: at most 1.5).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FLOOR = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
               resources={"metadata": {"path": sys.argv[2]}}).execute()
"""


def floor_command(notebook: Path) -> list[str]:
    return [sys.executable, "-c", FLOOR, str(notebook), str(notebook.parent)]


def timed(argv) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--unsandboxed", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from autograder.submission import repaired
    from coursekit.sample_submissions import submission

    tmp = Path(tempfile.mkdtemp())
    graded, floor_nb = tmp / "02_self_attention.ipynb", tmp / "floor.ipynb"
    nb = submission()
    nbformat.write(nb, graded)
    nbformat.write(repaired(nb, nb)[0], floor_nb)  # the learner's cells grading runs, visible tests only
    grade_cmd = [sys.executable, "-m", "autograder", "grade", str(graded), "--json"]
    grade_cmd += ["--unsandboxed"] if args.unsandboxed else []
    floor_cmd = floor_command(floor_nb)
    timed(grade_cmd)  # build the cached course template once
    grade, floor = [], []
    for _ in range(args.runs):
        grade.append(timed(grade_cmd))
        floor.append(timed(floor_cmd))
    med = statistics.median
    mode = "unsandboxed" if args.unsandboxed else "sandboxed"
    print(f"grade via CLI, fresh process ({mode}), median of {args.runs}: {med(grade):.2f} s")
    print(f"floor: fresh process, nbclient runs imports + answers + visible tests: {med(floor):.2f} s")
    print(f"ratio grade / floor: {med(grade) / med(floor):.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
