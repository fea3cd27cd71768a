"""Time grading one full-marks notebook (Chapter 2's by default) against the least any grader must do.

    .venv/bin/python benchmarks/grade_one.py [--runs 5] [--unsandboxed] [--chapter 02_self_attention]
    .venv/bin/python benchmarks/grade_one.py --chapter 10_attention_kernels --runs 3

Paired runs, each a fresh process, alternating:
* grade: ``python -m autograder grade NB --json`` (sandboxed unless --unsandboxed) of the
  chapter's learner notebook with every answer the reference's;
* floor: a fresh process that starts a kernel with nbclient and runs the cells grading
  must run (imports, the answers, the visible tests; no demo cells), nothing else.
Prints the medians, their ratio (issue 8's target: at most 1.5), the score the grading gave
(full marks, or the figures mean nothing) and the load average, and for Chapter 10 the wall
time against issue 51's target: under 90 s on two cores (its kernels run under Triton's
interpreter, in the sandbox, on the CPU).
"""
from __future__ import annotations

import argparse
import json
import os
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


# Wall-time targets of grading one complete notebook, where an issue sets one (seconds).
WALL_TARGETS = {"10_attention_kernels": (90.0, "issue 51: under 90 s on two cores")}


def timed(argv) -> tuple[float, str]:
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--unsandboxed", action="store_true")
    parser.add_argument("--chapter", default="02_self_attention")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from autograder.submission import repaired
    from coursekit.sample_submissions import submission

    tmp = Path(tempfile.mkdtemp())
    graded, floor_nb = tmp / f"{args.chapter}.ipynb", tmp / "floor.ipynb"
    nb = submission(chapter=args.chapter)
    nbformat.write(nb, graded)
    nbformat.write(repaired(nb, nb)[0], floor_nb)  # the learner's cells grading runs, visible tests only
    grade_cmd = [sys.executable, "-m", "autograder", "grade", str(graded), "--json"]
    grade_cmd += ["--unsandboxed"] if args.unsandboxed else []
    floor_cmd = floor_command(floor_nb)
    load_before = os.getloadavg()[0]
    timed(grade_cmd)  # build the cached course template once
    grade, floor, scores = [], [], set()
    for _ in range(args.runs):
        seconds, report = timed(grade_cmd)
        grade.append(seconds)
        result = json.loads(report)
        scores.add(f"{result['score']:g} / {result['max_score']:g}")
        floor.append(timed(floor_cmd)[0])
    med = statistics.median
    mode = "unsandboxed" if args.unsandboxed else "sandboxed"
    print(f"{args.chapter}: the reference's answers scored {', '.join(sorted(scores))} "
          f"(load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores)")
    print(f"grade via CLI, fresh process ({mode}), median of {args.runs}: {med(grade):.2f} s "
          f"(runs: {', '.join(f'{g:.1f}' for g in grade)})")
    print(f"floor: fresh process, nbclient runs imports + answers + visible tests: {med(floor):.2f} s")
    print(f"ratio grade / floor: {med(grade) / med(floor):.2f} (target <= 1.5)")
    if args.chapter in WALL_TARGETS:
        target, why = WALL_TARGETS[args.chapter]
        verdict = "within" if max(grade) < target else "OVER"
        print(f"wall time of grading one complete notebook: {med(grade):.1f} s median, {max(grade):.1f} s slowest: "
              f"{verdict} the target ({why})")


if __name__ == "__main__":
    main()
