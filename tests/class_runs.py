"""Class runs the tests share: the sample class, as the README's commands grade it, and five of its
students graded in two shards and merged (``conftest``'s session fixtures ``readme_clone`` and
``sharded_class``). Each costs a class run of 40-60 s; tests that only read them get a copy. The
sample class released and collected (``released_class``) is made once too, and copied for each new course."""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from coursekit.conventions import ROOT, with_python_bin_on_path

CHAPTER = "02_self_attention"
# The sample class's scores (examples/sample_class.py), as the README shows them.
EXPECTED = {"ada": 10.0, "ben": 5.0, "cleo": 9.0, "dan": 0.0, "eve": 0.0, "finn": 0.0, "gus": 10.0,
            "hana": 10.0, "ivan": 0.0}
SHARDED_STUDENTS = {"ada", "ben", "cleo", "dan", "eve"}  # correct, partly wrong, tampering, empty


def cli(*args, check=True, **kwargs):
    proc = subprocess.run([sys.executable, "-m", "autograder", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200, env=with_python_bin_on_path(), **kwargs)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def cli_together(*commands: list[str], cwd=ROOT, env=None) -> list[subprocess.CompletedProcess]:
    """Several class commands at once (shards, as on two machines); each must succeed."""
    procs = [subprocess.Popen([sys.executable, "-m", "autograder", *args], cwd=cwd, text=True,
                              env=env or with_python_bin_on_path(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for args in commands]
    done = []
    for args, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, f"{args}: {out}{err}"
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def grades(folder: Path) -> dict[str, float]:
    with open(folder / "class-grades.csv") as f:
        return {row["student"]: float(row["total"]) for row in csv.DictReader(f)}


def released_class(tmp: Path) -> Path:
    """The sample class (``examples/sample_class.py``) released and collected, as an instructor
    would (``conftest``'s session fixture: made once, copied by ``new_course``)."""
    sample, course = tmp / "sample", tmp / "course"
    subprocess.run([sys.executable, str(ROOT / "examples" / "sample_class.py"), str(sample)], check=True,
                   capture_output=True)
    cli("release", "--course", str(course), CHAPTER)
    cli("collect", str(sample / "submitted"), "--course", str(course))
    cli("collect", str(sample / "lms-download"), "--course", str(course), "--chapter", CHAPTER)
    return course


def new_course(tmp: Path, source: Path, students=None) -> Path:
    """A copy of the course folder SOURCE (``released_class``, or one graded already) in a new
    course folder under ``tmp``, with only the submissions of ``students``, if given."""
    course = tmp / f"course-{len(list(tmp.glob('course-*')))}"
    shutil.copytree(source, course, symlinks=True, ignore=lambda folder, names: [
        n for n in names if students is not None and Path(folder) == source / "submitted" and n not in students])
    return course


def sharded_class(tmp: Path, released: Path):
    """``SHARDED_STUDENTS`` graded in two shards at once and merged: (course, shard folders, merge's output)."""
    course = new_course(tmp, released, students=SHARDED_STUDENTS)
    shards = [tmp / f"shard-{index}" for index in (1, 2)]
    cli_together(*(["grade-class", "--course", str(course), "--shard", f"{index}/2", "--out", str(out),
                    "--workers", "1"] for index, out in enumerate(shards, 1)))
    merged = cli("merge", *map(str, shards), "--into", str(course))
    return course, shards, merged


# ------------------------------------------------------------------ the README's commands
SECTIONS = ("For learners", "For instructors", "Grading a whole class")
LEFT_TO_CI = ("make book", "make test")


def readme_sections() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def code_blocks(section: str, lang: str) -> list[str]:
    """Fenced blocks of one language (also inside list items), dedented."""
    blocks = []
    for match in re.finditer(rf"^( *)```{lang}\n(.*?)^\1```$", section, flags=re.M | re.S):
        indent = len(match[1])
        blocks.append("\n".join(line[indent:] for line in match[2].splitlines()))
    return blocks


def readme_commands() -> list[str]:
    sections = readme_sections()
    assert set(SECTIONS) <= set(sections), "a README section this test reads was renamed"
    commands = []
    for title in SECTIONS:
        for block in code_blocks(sections[title], "bash"):
            for line in block.splitlines():
                if line.strip() and not line.lstrip().startswith("#") \
                        and not line.lstrip().startswith(LEFT_TO_CI):
                    commands.append(line)
    return commands


def readme_clone(tmp: Path):
    """A fresh clone of the committed repository, run through the README's commands (its class is
    the sample class, graded into ``my-class``): (folder, command -> its completed process)."""
    folder = tmp / "attention-from-scratch"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(folder)], check=True, capture_output=True)
    (folder / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    results = {}
    for command in readme_commands():
        proc = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=900)
        assert proc.returncode == 0, f"README command failed: {command}\n{proc.stdout}\n{proc.stderr}"
        results[command] = proc
    return folder, results
