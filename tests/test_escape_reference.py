"""No line of a reference or hidden module reaches the sandbox, in any chapter.

When an exercise is graded on its own, the exercises it uses and its model arguments are the
reference's. They used to be sent into the kernel as source; now they are stand-ins whose calls
the grader's own process answers (``autograder.standins``). Each chapter's attack notebook keeps
every stub, so that nothing of the reference is in it, and wraps the kernel's ``attn_probe.run``:
during every hidden test it reads every file under the exchange folder, and at the end it scans
its whole memory (every readable region of ``/proc/self/mem``) for printable runs. It reports only
the hashes of the reference lines it found, through the error of the last exercise's stub, which
the feedback shows. The test knows the lines (the generated ``solutions/`` modules, less what the
learner notebook and the kernel's own library show anyway) and checks that none was found.
"""
from __future__ import annotations

import hashlib
import json
import re

import nbformat
import pytest

from coursekit import conventions as C
from coursekit.sample_submissions import learner_notebook
from support import ROOT, grading_pool, submission, written

pytestmark = pytest.mark.pipeline

MIN_LINE = 24  # characters of a stripped line worth searching for: shorter ones are idiom

SNOOP = r'''
import attn_probe as _attn_probe
import hashlib as _hashlib, os as _os
import numpy as _np
_FOUND, _RUN = set(), _attn_probe.run

def _note(data):
    """Hash every printable run as long as a line searched for (numpy finds the runs: a regular
    expression takes seconds over a kernel's memory)."""
    codes = _np.frombuffer(b"\0" + data + b"\0", _np.uint8)
    printable = (codes - 0x20) < 0x5f  # 0x20 to 0x7e, in one comparison of unsigned bytes
    edges = _np.flatnonzero(printable[1:] != printable[:-1])
    starts, ends = edges[::2], edges[1::2]
    for start, end in zip(starts[ends - starts >= %d].tolist(), ends[ends - starts >= %d].tolist()):
        line = data[start:end].strip()
        if len(line) in _LENGTHS:  # only a line as long as one searched for is worth hashing
            _FOUND.add(_hashlib.sha256(line).hexdigest()[:16])

def _read_exchange():
    for top, _, files in _os.walk("/exchange"):
        for name in files:
            try:
                with open(_os.path.join(top, name), "rb") as f:
                    data = f.read(64 << 20)
            except OSError:
                continue
            _note(data.replace(b"\\n", b"\n"))  # JSON strings keep their newlines escaped

def _read_memory():
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", buffering=0) as mem:
        for line in maps:
            where, perms = line.split()[:2]
            start, end = (int(x, 16) for x in where.split("-"))
            if not perms.startswith("rw") or end - start > (1 << 30):  # the heap and anonymous maps
                continue
            for at in range(start, end, 32 << 20):  # in pieces that overlap by a line's length
                try:
                    mem.seek(at)
                    _note(mem.read(min(end - at, (32 << 20) + 400)))
                except (OSError, ValueError, OverflowError):
                    break

_SCANNED = []

def _snooping_run(test_id, ns):
    if test_id.startswith("test_" + _LAST) and not _SCANNED:  # before the last tests: outside any call's time limit
        _read_exchange()
        _read_memory()
        _SCANNED.append(test_id)
    try:
        return _RUN(test_id, ns)
    finally:
        _read_exchange()

_attn_probe.run = _snooping_run

def _report():
    found = sorted(_FOUND & _NEEDLES)
    return f"SNOOPED {len(found)} " + " ".join(found[:12]) + " END"
''' % (MIN_LINE, MIN_LINE)


def _hash(line: str) -> str:
    return hashlib.sha256(line.strip().encode()).hexdigest()[:16]


def secret_lines(chapter: str) -> set[str]:
    """The lines of the chapter's reference and hidden modules that nothing public shows."""
    number = chapter.split("_")[0]
    public = set()  # what runs in the kernel by design: the learner notebook, the test cells
    instructor = nbformat.read(ROOT / "source" / chapter / f"{chapter}.ipynb", as_version=4)
    for cell in [*learner_notebook(chapter).cells, *(c for c in instructor.cells if C.is_test_cell(c))]:
        public |= {line.strip() for line in cell.source.splitlines()}
    for path in (ROOT / "autograder" / "sandboxed").glob("*.py"):
        public |= {line.strip() for line in path.read_text().splitlines()}
    lines = set()
    for path in (ROOT / "solutions").glob(f"ch{number}_*.py"):
        lines |= {line.strip() for line in path.read_text().splitlines()}
    return {line for line in lines - public if len(line) >= MIN_LINE and not line.startswith("#")}


def attack(chapter: str) -> tuple[nbformat.NotebookNode, dict[str, str]]:
    """The chapter's stubs, the snooping cell first and a cell printing what it found last. The
    snooping cell reaches the grader's module: the static check rightly takes every from-scratch
    exercise's marks for that, so the findings come back in the graded notebook's output."""
    secrets = secret_lines(chapter)
    needles = {_hash(line): line for line in secrets}
    release = learner_notebook(chapter)
    last = [C.grade_id(c) for c in release.cells if C.is_answer_cell(c)][-1]
    lengths = sorted({len(line) for line in secrets})
    snoop = SNOOP + f"\n_NEEDLES = set({sorted(needles)!r})\n_LENGTHS = set({lengths!r})\n_LAST = {last!r}\n"
    return submission(base="stub", prepend=[snoop], append=["print(_report())"], chapter=chapter), needles


def graded_output(path: str, keep: str) -> str:
    """In a grading process: grade PATH through the real pipeline, keeping its nbgrader course in
    KEEP; the outputs of the autograded notebook's last cell (or why there are none)."""
    from pathlib import Path

    from autograder import feedback
    from autograder.grading import grade
    executed = []
    render = feedback.render

    def keeping_outputs(course, chapter, student, autograded, *rest):  # the page keeps none
        executed.append(nbformat.read(autograded, as_version=4))
        return render(course, chapter, student, autograded, *rest)
    feedback.render = keeping_outputs
    try:
        grade(Path(path), keep_course=Path(keep))
    except Exception as err:  # noqa: BLE001 - said in the assertion
        return f"grading failed: {type(err).__name__}: {err}"
    finally:
        feedback.render = render
    if not executed:
        return "no autograded notebook"
    cell = executed[0].cells[-1]
    return "".join(o.get("text", "") + str(o.get("evalue", "")) for o in cell.get("outputs", []))


CHAPTERS = C.chapter_names()


@pytest.fixture(scope="module")
def snooped(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("snoop")
    cases = {chapter: attack(chapter) for chapter in CHAPTERS}
    paths = written({ch: nb for ch, (nb, _) in cases.items()}, tmp)
    outputs = grading_pool().map(graded_output, paths.values(), [str(tmp / f"{ch}-course") for ch in paths])
    return {ch: (text, cases[ch][1]) for ch, text in zip(paths, outputs)}


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_line_of_the_reference_reaches_the_kernel(snooped, chapter):
    text, needles = snooped[chapter]
    found = re.search(r"SNOOPED (\d+) ([0-9a-f ]*) ?END", text)
    assert found, f"the snooping notebook did not report: {text[:2000]}"
    leaked = [needles.get(h, h) for h in found.group(2).split()]
    assert found.group(1) == "0", f"{chapter}: {found.group(1)} reference lines seen in the kernel: {leaked}"
    assert len(needles) > 20, f"{chapter}: too few lines to search for ({len(needles)})"
