"""Throughput of class grading on a synthetic Chapter 2 class.

    .venv/bin/python benchmarks/class_throughput.py [--students 100] [--skip-baseline]

Prints submissions per minute for plain sequential `nbgrader autograde` (the CLI, one
process grading every student, on the submissions as written), `grade-class` with 1
and with 2 workers, and the per-notebook cost with 1 worker against the floor of
``grade_one.py``: a fresh process in which nbclient runs the cells any grader must run
(imports, answers, visible tests; no demo cells, no hidden tests).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursekit.conventions import with_python_bin_on_path  # noqa: E402

CHAPTER = "02_self_attention"
UNSCALED = ("def scaled_dot_product_attention(query, key, value, mask=None):\n"
            "    scores = query @ key.transpose(-2, -1)\n"
            "    if mask is not None:\n        scores = scores.masked_fill(~mask, float('-inf'))\n"
            "    weights = scores.softmax(-1)\n    return weights @ value, weights\n")
UPPER = "def causal_mask(n):\n    return torch.ones(n, n, dtype=torch.bool).triu()\n"
OFF_BY_ONE = "def padding_mask(lengths, max_len):\n    return torch.arange(max_len)[None] <= lengths[:, None]\n"


def synthetic_class(folder: Path, count: int) -> None:
    """Mostly correct work, some common mistakes, some untouched stubs."""
    from coursekit.sample_submissions import submission
    mistakes = [submission({"scaled_dot_product_attention": UNSCALED}), submission({"causal_mask": UPPER}),
                submission({"padding_mask": OFF_BY_ONE})]
    for i in range(count):
        if i % 10 < 6:
            nb = submission()
        elif i % 10 < 9:
            nb = mistakes[i % len(mistakes)]
        else:
            nb = submission(base="stub")
        path = folder / "submitted" / f"s{i:03d}" / CHAPTER / f"{CHAPTER}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)


def timed(cmd, cwd) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env=with_python_bin_on_path())
    return time.perf_counter() - started


def floor(path: Path, runs=5) -> float:
    """The least any grader must do per notebook (``grade_one.floor_command``), median of fresh processes."""
    from grade_one import floor_command, timed as timed_fresh
    from autograder.submission import repaired
    raw = nbformat.read(path, as_version=4)
    graded = path.with_name("floor.ipynb")
    nbformat.write(repaired(raw, raw)[0], graded)
    return statistics.median(timed_fresh(floor_command(graded)) for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--skip-baseline", action="store_true")
    args = parser.parse_args()
    n = args.students
    tmp = Path(tempfile.mkdtemp(prefix="class-bench-"))
    synthetic_class(tmp / "class", n)
    py = sys.executable
    rates = {}

    if not args.skip_baseline:
        base = tmp / "nbgrader-course"
        (base / "source" / CHAPTER).mkdir(parents=True)
        shutil.copyfile(ROOT / "source" / CHAPTER / f"{CHAPTER}.ipynb", base / "source" / CHAPTER / f"{CHAPTER}.ipynb")
        (base / "nbgrader_config.py").write_text("c = get_config()\nc.CourseDirectory.course_id = 'bench'\n")
        subprocess.run([py, "-m", "nbgrader", "generate_assignment", CHAPTER], cwd=base, check=True,
                       capture_output=True, env=with_python_bin_on_path())
        shutil.copytree(tmp / "class" / "submitted", base / "submitted")
        seconds = timed([py, "-m", "nbgrader", "autograde", CHAPTER, "--log-level=ERROR"], base)
        rates["plain nbgrader autograde (sequential CLI)"] = n / seconds * 60

    for workers in (1, 2):
        course = tmp / f"course-{workers}"
        subprocess.run([py, "-m", "autograder", "release", "--course", str(course), CHAPTER], cwd=ROOT,
                       check=True, capture_output=True, env=with_python_bin_on_path())
        shutil.copytree(tmp / "class" / "submitted", course / "submitted")
        seconds = timed([py, "-m", "autograder", "grade-class", "--course", str(course), "--workers", str(workers)],
                        ROOT)
        rates[f"grade-class --workers {workers}"] = n / seconds * 60
        if workers == 1:
            per_notebook = seconds / n

    graded_floor = floor(tmp / "class" / "submitted" / "s000" / CHAPTER / f"{CHAPTER}.ipynb")
    print(f"synthetic class: {n} Chapter 2 submissions")
    for name, rate in rates.items():
        print(f"  {name:45s} {rate:6.1f} submissions/min")
    if "plain nbgrader autograde (sequential CLI)" in rates:
        speedup = rates["grade-class --workers 2"] / rates["plain nbgrader autograde (sequential CLI)"]
        print(f"  2 workers vs sequential nbgrader: {speedup:.2f}x (target >= 1.8x)")
    print(f"  per notebook with 1 worker: {per_notebook:.2f} s")
    print(f"  floor, a fresh process runs imports + answers + visible tests with nbclient: {graded_floor:.2f} s")
    print(f"  per-notebook cost / floor: {per_notebook / graded_floor:.2f}x (target <= 1.2x)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
