"""Grade one submitted notebook: real nbgrader underneath, judged outside the kernel.

1. The submission goes into a scratch nbgrader course whose gradebook was made by
   ``generate_assignment`` from the instructor notebook (cached per chapter).
2. ``autograde`` runs it with the hidden tests restored, in a kernel started with the
   guard (``guard.py``) and with ``GuardedExecute`` feeding each hidden test its inputs.
3. This process judges every test cell from the returned values against the reference
   and writes the scores into the gradebook; ``generate_feedback`` then renders the
   feedback from a copy whose test cells show the judge's messages, not their source.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
import numpy as np
import torch

from . import hidden as H
from .chapters import ChapterInfo
from .env import ROOT, use_python_bin_on_path
from .static_check import static_builtin_use
from .submission import load, repaired

CACHE = Path(os.environ.get("ATTN_GRADER_CACHE", ROOT / ".cache" / "grader"))
SCRATCH_PARENT = Path(tempfile.gettempdir()) / "attn-grader"
MAX_RESULT_BYTES = 64 * 1024 * 1024
COURSE_ID = "attention-from-scratch"


@dataclasses.dataclass
class TestOutcome:
    test_id: str
    exercise: str
    points: float
    score: float
    problems: list[str]


class GradingSession:
    """The parent's side of the kernel exchange for one submission."""

    def __init__(self, chapter: ChapterInfo, workdir: Path, nb):
        self.chapter = chapter
        self.hidden = chapter.hidden()
        self.cases, self.results, self.private = (workdir / n for n in ("cases", "results", "private"))
        for d in (self.cases, self.results, self.private):
            d.mkdir(parents=True)
        self.test_order = [c.metadata["nbgrader"]["grade_id"] for c in _graded_tests(
            nbformat.read(chapter.instructor_notebook, as_version=4))]
        self.probes = {t: self.hidden.build(t) for t in self.test_order}
        self.completed: set[str] = set()
        self.static = static_builtin_use(nb, self.hidden.from_scratch)

    def watches(self, grade_id) -> bool:
        return grade_id in self.probes and grade_id not in self.completed

    def before_test(self, test_id):
        for d in (self.cases, self.results):
            for f in d.iterdir():
                f.unlink()
        arrays, probes = {}, []
        for i, probe in enumerate(self.probes[test_id]):
            probes.append(self._encode(i, probe, arrays))
        np.savez(self.cases / f"{test_id}.npz", **arrays)
        (self.cases / f"{test_id}.json").write_text(json.dumps({"test": test_id, "probes": probes}))

    def after_test(self, test_id):
        for suffix in (".json", ".npz"):
            src = self.results / f"{test_id}{suffix}"
            if src.is_file() and not src.is_symlink() and src.stat().st_size < MAX_RESULT_BYTES:
                shutil.copyfile(src, self.private / f"{test_id}{suffix}")
        for d in (self.cases, self.results):
            for f in d.iterdir():
                f.unlink()
        self.completed.add(test_id)

    def _deps_ready(self, dep) -> bool:
        """Substitute the reference for a dependency only once its own tests have all run."""
        return all(t in self.completed for t in self.test_order if _exercise_of(t, [dep]) == dep)

    def _deps(self, probe: H.Probe) -> dict:
        ready = [d for d in probe.deps if self._deps_ready(d)]
        return {"names": ready, "source": self.hidden.dependency_source(ready)} if ready else {}

    def _encode(self, index, probe: H.Probe, arrays) -> dict:
        def enc(value):
            if isinstance(value, torch.Tensor):
                key = f"p{index}_{len(arrays)}"
                arrays[key] = value.detach().numpy()
                return {"t": key}
            if isinstance(value, (list, tuple)):
                return [enc(v) for v in value]
            return {"v": value}
        return {
            "target": probe.target,
            "args": [enc(a) for a in probe.args],
            "kwargs": {k: enc(v) for k, v in probe.kwargs.items()},
            "init": probe.init,
            "state": {k: enc(v)["t"] for k, v in (probe.state or {}).items()},
            "grad_args": list(probe.grad_args),
            "cotangents": [enc(c)["t"] for c in probe.cotangents],
            "deps": self._deps(probe),
            "method": probe.method,
            "dtype": probe.dtype,
            "time_limit": probe.time_limit,
            "train": False if probe.init is not None else None,
        }

    # ---------------------------------------------------------------- judging
    def judge(self, points: dict[str, float]) -> list[TestOutcome]:
        exercises = list(self.hidden_exercises())
        outcomes = []
        for test_id in self.test_order:
            exercise = _exercise_of(test_id, exercises)
            problems = self._judge_test(test_id, exercise)
            score = points[test_id] if not problems else 0.0
            outcomes.append(TestOutcome(test_id, exercise, points[test_id], score, problems))
        return outcomes

    def hidden_exercises(self):
        nb = nbformat.read(self.chapter.instructor_notebook, as_version=4)
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution") and meta.get("grade_id"):
                yield meta["grade_id"]

    def _judge_test(self, test_id, exercise) -> list[str]:
        if exercise in self.static:
            return [self.static[exercise]]
        got = self._read_results(test_id)
        if got is None:
            return ["this test did not run (the kernel died, timed out or stopped before it)"]
        problems = []
        for probe, result in zip(self.probes[test_id], got):
            problems += H.judge_probe(probe, result, self.hidden.from_scratch)
            if problems:
                break
        else:
            if len(got) < len(self.probes[test_id]):
                problems.append("this test did not finish (the kernel stopped part way)")
        return problems

    def _read_results(self, test_id):
        meta_path, arr_path = self.private / f"{test_id}.json", self.private / f"{test_id}.npz"
        try:
            meta = json.loads(meta_path.read_text())
            with np.load(arr_path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
            return [_decode_result(r, arrays) for r in meta["probes"]]
        except Exception:  # noqa: BLE001 - missing or forged files count as "did not run"
            return None


class Foreign:
    """A returned value that is not a plain tensor (described, never executed)."""

    def __init__(self, description):
        self.description = description

    def __repr__(self):
        return self.description


def _decode_value(desc, arrays):
    kind = desc.get("kind") if isinstance(desc, dict) else None
    if kind == "tensor":
        arr = arrays[desc["ref"]]
        tensor = torch.from_numpy(np.array(arr, copy=True))
        if str(tensor.dtype).replace("torch.", "") != desc.get("dtype"):
            return Foreign("a tensor whose data could not be read back")
        return tensor
    if kind in ("tuple", "list"):
        return tuple(_decode_value(d, arrays) for d in desc["items"])
    if kind == "tensor-subclass":
        return Foreign(f"a tensor subclass ({desc.get('type')}); return a plain torch.Tensor")
    if kind == "tensor-too-large":
        return Foreign(f"a tensor of shape {tuple(desc.get('shape', ()))}")
    return Foreign(f"a {desc.get('type', 'value')}" if isinstance(desc, dict) else "an unreadable value")


def _decode_result(result, arrays):
    result = dict(result)
    if result.get("status") == "ok":
        result["value"] = _decode_value(result.get("output"), arrays)
        result["grads"] = {k: _decode_value(v, arrays) for k, v in result.get("grads", {}).items()}
        result["grads"] = {k: v for k, v in result["grads"].items() if isinstance(v, torch.Tensor)}
        result["inputs_after"] = [None if d is None else _decode_value(d, arrays)
                                  for d in result.get("inputs_after", [])]
    return result


def _exercise_of(test_id, exercises):
    owners = [e for e in exercises if test_id == f"test_{e}" or test_id.startswith(f"test_{e}_")]
    return max(owners, key=len) if owners else None


def _graded_tests(nb):
    return [c for c in nb.cells if c.cell_type == "code"
            and c.metadata.get("nbgrader", {}).get("grade") and c.metadata["nbgrader"].get("grade_id")]


# ------------------------------------------------------------------ nbgrader course

def _config(root: Path):
    from traitlets.config import Config
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    c.Execute.timeout = int(os.environ.get("ATTN_GRADER_CELL_TIMEOUT", "60"))
    c.Execute.startup_timeout = 120
    c.Execute.extra_arguments = ["--HistoryManager.hist_file=:memory:", "--IPKernelApp.log_level=ERROR"]
    from .execute import GuardedExecute
    from nbgrader.converters.autograde import Autograde
    c.Autograde.autograde_preprocessors = [
        GuardedExecute if p.__name__ == "Execute" else p
        for p in Autograde.class_traits()["autograde_preprocessors"].default()]
    return c


def _api(root: Path):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    config = _config(root)
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def course_template(chapter: ChapterInfo) -> Path:
    """A course folder with the chapter generated into its gradebook, built once and cached."""
    import nbgrader
    source = chapter.instructor_notebook.read_bytes()
    key = hashlib.sha256(source + nbgrader.__version__.encode()).hexdigest()[:16]
    template = CACHE / f"{chapter.name}-{key}"
    if (template / "ready").exists():
        return template
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{chapter.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (template / "ready").exists():
            return template
        building = Path(tempfile.mkdtemp(prefix=f"{chapter.name}-", dir=CACHE))
        src = building / "source" / chapter.name
        src.mkdir(parents=True)
        (src / f"{chapter.name}.ipynb").write_bytes(source)
        result = _api(building).generate_assignment(chapter.name, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"generate_assignment failed: {result.get('error', '')[-500:]}")
        (building / "ready").write_text("ok")
        shutil.rmtree(template, ignore_errors=True)
        building.rename(template)
    return template


def _kernel_environment(work: Path, notebook_dir: Path, private=()) -> dict:
    kernel = work / "kernel"
    startup = kernel / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    shutil.copyfile(Path(__file__).with_name("guard.py"), startup / "00-attn-guard.py")
    lib = kernel / "lib"
    lib.mkdir()
    shutil.copyfile(Path(__file__).with_name("probe.py"), lib / "attn_probe.py")
    scratch = kernel / "scratch"
    scratch.mkdir()
    rules = [("deny", str(ROOT)), ("deny", str(SCRATCH_PARENT)), ("deny", str(CACHE)),
             *(("deny", str(p)) for p in private),
             ("read", sys.prefix), ("read", sys.base_prefix), ("read", str(lib)),
             ("read", str(kernel / "ipython")), ("read", str(work / "cases")),
             ("write", str(work / "results")), ("write", str(scratch)),
             ("write", str(notebook_dir))]
    return {
        "IPYTHONDIR": str(kernel / "ipython"),
        "PYTHONPATH": str(lib),
        "ATTN_GRADER_RULES": json.dumps(rules),
        "ATTN_GRADER_CASES": str(work / "cases"),
        "ATTN_GRADER_RESULTS": str(work / "results"),
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": str(scratch),
        "TMPDIR": str(scratch),
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
    }


@dataclasses.dataclass
class Report:
    chapter: str
    student: str
    outcomes: list[TestOutcome]
    feedback_html: Path | None = None
    repairs: list[str] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict:
        exercises: dict[str, dict] = {}
        for o in self.outcomes:
            entry = exercises.setdefault(o.exercise, {"score": 0.0, "max_score": 0.0, "feedback": []})
            entry["score"] += o.score
            entry["max_score"] += o.points
            if o.problems:
                entry["feedback"] += [f"{o.test_id} ({o.score:g}/{o.points:g}): {p}" for p in o.problems]
            else:
                entry["feedback"].append(f"{o.test_id} ({o.score:g}/{o.points:g}): passed")
        return {"notebook": self.chapter,
                "score": sum(o.score for o in self.outcomes),
                "max_score": sum(o.points for o in self.outcomes),
                "exercises": exercises}


def grade(path: Path, student: str = "student", feedback_dir: Path | None = None,
          chapter: str | None = None, keep_course: Path | None = None,
          private: tuple[Path, ...] = ()) -> Report:
    """Grade one notebook. Raises SubmissionError for a file that is not gradable.

    keep_course: copy the finished nbgrader course (gradebook, autograded notebook,
    feedback) there, e.g. to run ``nbgrader export`` on it.
    private: more folders the submitted code must not read (a class's course folder).
    """
    nb, info = load(path, chapter)
    use_python_bin_on_path()
    template = course_template(info)
    SCRATCH_PARENT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="grade-", dir=SCRATCH_PARENT))
    saved_env = dict(os.environ)
    try:
        course = work / "course"
        shutil.copytree(template, course)
        submitted = course / "submitted" / student / info.name
        submitted.mkdir(parents=True)
        release = nbformat.read(template / "release" / info.name / f"{info.name}.ipynb", as_version=4)
        clean, repairs = repaired(nb, release)
        nbformat.write(clean, submitted / f"{info.name}.ipynb")
        notebook_dir = course / "autograded" / student / info.name
        session = GradingSession(info, work, nb)
        os.environ.update(_kernel_environment(work, notebook_dir, private))
        from .execute import GuardedExecute
        GuardedExecute.session = session
        api = _api(course)
        try:
            result = api.autograde(info.name, student, force=True, create=True)
        finally:
            GuardedExecute.session = None
            os.environ.clear()
            os.environ.update(saved_env)
        autograded = notebook_dir / f"{info.name}.ipynb"
        if not autograded.exists():
            raise RuntimeError("nbgrader autograde produced no notebook: "
                               + (result.get("error") or result.get("log") or "")[-300:].replace("\n", " "))
        points = {c.metadata["nbgrader"]["grade_id"]: float(c.metadata["nbgrader"]["points"])
                  for c in _graded_tests(nbformat.read(info.instructor_notebook, as_version=4))}
        if os.environ.get("ATTN_GRADER_KEEP"):
            shutil.copyfile(autograded, work / "autograded-raw.ipynb")
        outcomes = session.judge(points)
        _store_scores(course, info, student, outcomes)
        submitted_text = "\n".join(c.source for c in nb.cells)
        html = _feedback(api, course, info, student, autograded, outcomes, submitted_text)
        report = Report(info.name, student, outcomes, repairs=repairs)
        if keep_course is not None:
            shutil.copytree(course, keep_course, dirs_exist_ok=True)
        if feedback_dir is not None and html is not None:
            feedback_dir.mkdir(parents=True, exist_ok=True)
            report.feedback_html = feedback_dir / f"{student}-{info.name}.html"
            shutil.copyfile(html, report.feedback_html)
        return report
    finally:
        if not os.environ.get("ATTN_GRADER_KEEP"):  # debugging aid: keep the scratch course
            shutil.rmtree(work, ignore_errors=True)


def _store_scores(course, info, student, outcomes):
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", COURSE_ID) as gb:
        for o in outcomes:
            grade = gb.find_grade(o.test_id, info.name, info.name, student)
            grade.auto_score = o.score
            grade.manual_score = None
        gb.db.commit()


def _feedback(api, course, info, student, autograded, outcomes, submitted_text) -> Path | None:
    """Render nbgrader feedback from a copy whose test cells show only the judge's verdict."""
    by_id = {o.test_id: o for o in outcomes}
    nb = nbformat.read(autograded, as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        outcome = by_id.get(grade_id)
        if outcome is None:
            cell.outputs = []  # the submission's own outputs stay in the submission
            continue
        cell.source = strip_hidden(cell.source)
        verdict = "passed" if not outcome.problems else "\n".join(f"- {p}" for p in outcome.problems)
        cell.outputs = [nbformat.v4.new_output(
            "stream", name="stdout" if not outcome.problems else "stderr",
            text=f"{outcome.score:g} / {outcome.points:g} points: {verdict}\n")]
    nbformat.write(nb, autograded)
    result = api.generate_feedback(info.name, student, force=True)
    html = course / "feedback" / student / info.name / f"{info.name}.html"
    if not result["success"] or not html.exists():
        return None
    if reveals_hidden_source(html.read_text(errors="replace"), info, submitted_text):
        html.unlink()  # never hand out hidden test source; the scores stand
        return None
    return html


def reveals_hidden_source(text: str, info: ChapterInfo, submitted_text: str) -> bool:
    """Does rendered feedback contain a hidden-test line the submission did not write itself?"""
    hidden_lines = set()
    for cell in nbformat.read(info.instructor_notebook, as_version=4).cells:
        hidden_lines.update(line.strip() for line in split_hidden(cell.source)[1] if line.strip())
    import html as html_lib
    plain = html_lib.unescape(re.sub(r"<[^>]+>", "", text))
    return "BEGIN HIDDEN TESTS" in plain or any(
        line in plain and line not in submitted_text for line in hidden_lines)


def split_hidden(source: str) -> tuple[list[str], list[str]]:
    """(visible lines, hidden-test lines) of a test cell's source."""
    visible, hidden, inside = [], [], False
    for line in source.splitlines():
        if line.strip() == "### BEGIN HIDDEN TESTS":
            inside = True
        elif line.strip() == "### END HIDDEN TESTS":
            inside = False
        else:
            (hidden if inside else visible).append(line)
    return visible, hidden


def strip_hidden(source: str) -> str:
    return "\n".join(split_hidden(source)[0])
