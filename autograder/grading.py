"""Grade one submitted notebook: real nbgrader underneath, run in the OS sandbox, judged outside it.

1. The kernel starts at once, in the sandbox (``kernel``, ``sandbox``); it boots while
   this process imports nbgrader and torch.
2. The submission, repaired (``submission``), goes into a scratch nbgrader course whose
   gradebook was made by ``generate_assignment`` (``template``). ``autograde`` restores
   the hidden tests and runs the notebook in that kernel, with ``GuardedExecute``
   handing each hidden test its inputs (``session``, ``transfer``).
3. Right after the run, in ``autograde``'s own preprocessor steps, this process judges
   every test cell against the reference (``judge``) and writes those scores where
   nbgrader writes its grades (``judged_grades``); when asked, it renders the feedback
   page (``feedback``). Submitted code never runs here.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from jupyter_core.utils import run_sync

from . import sandbox, scratch, settings
from .exchange import Exchange
from .kernel import GradingKernelManager

KERNEL_ARGUMENTS = ["--HistoryManager.hist_file=:memory:", "--IPKernelApp.log_level=ERROR"]


class KernelSlot:
    """A grading kernel started ahead of the one submission it will run: it has seen nothing yet.

    Its scratch folder holds the exchange folder the kernel shares and, beside it, what the
    kernel never sees (the scratch nbgrader course, the taken results).
    """

    def __init__(self, sandboxed: bool = True, private: tuple[Path, ...] = (), limits: sandbox.Limits | None = None):
        """LIMITS: the sandbox's (default: those of ``settings.current()``)."""
        if sandboxed:
            sandbox.bubblewrap()
        self.work = scratch.new_folder()
        self.kernel = GradingKernelManager(exchange=Exchange(self.work / "exchange"), scratch=self.work / "scratch",
                                           sandboxed=sandboxed, limits=limits or settings.current().limits,
                                           private=[str(p) for p in private])
        try:
            run_sync(self.kernel.start_kernel)(extra_arguments=KERNEL_ARGUMENTS)
        except BaseException:  # a kernel that failed to start, or a boot interrupted (Ctrl-C)
            self.close()
            raise

    def close(self):
        try:
            run_sync(self.kernel.shutdown_kernel)(now=True)
        finally:
            if not settings.current().keep:  # debugging aid: keep the scratch course
                scratch.remove(self.work)


class KernelRelay:
    """Kernels for one grading after another: the next submission's kernel boots while the
    current one is graded (a kernel imports torch: seconds of processor time)."""

    def __init__(self, sandboxed: bool = True, private: tuple[Path, ...] = ()):
        self.sandboxed, self.private, self.spare = sandboxed, private, None

    def take(self, path: Path, chapter: str | None = None, boot_next: bool = True) -> KernelSlot:
        """The kernel for PATH (give it to ``grade``); a file that is not a gradable notebook is
        refused (SubmissionError) before it uses one up. BOOT_NEXT: start the next one's now."""
        from .submission import load
        load(path, chapter)
        current, self.spare = self.spare or KernelSlot(self.sandboxed, self.private), None
        if boot_next:
            try:
                self.spare = KernelSlot(self.sandboxed, self.private)
            except BaseException:  # nobody would close CURRENT
                current.close()
                raise
        return current

    def close(self):
        if self.spare is not None:
            self.spare, spare = None, self.spare
            spare.close()


def grade(path: Path, student: str = "student", feedback: bool = False,
          chapter: str | None = None, keep_course: Path | None = None,
          sandboxed: bool = True, private: tuple[Path, ...] = (), slot: KernelSlot | None = None):
    """Grade one notebook. Raises SubmissionError for a file that is not gradable, and
    SandboxUnavailable when ``sandboxed`` and no OS sandbox can run here.

    feedback: also render the feedback page (``Report.feedback_page``: nbgrader's, or the scores and
    verdicts alone when that cannot be made safely; ``feedback.write_page`` puts it where it belongs).
    keep_course: copy the finished nbgrader course (gradebook, autograded notebook,
    feedback) there, e.g. to run ``nbgrader export`` on it.
    sandboxed=False: run the kernel without the OS sandbox (the report says so).
    private: more folders an unsandboxed kernel's audit hook keeps it from reading.
    slot: a kernel started earlier (``KernelSlot``); it is used up either way.
    """
    with settings.in_use(settings.GraderSettings.from_environment()):  # read once per grading
        return _grade(path, student, feedback, chapter, keep_course, sandboxed, private, slot)


def _grade(path, student, feedback, chapter, keep_course, sandboxed, private, slot):
    from .submission import SubmissionError, load
    if not isinstance(student, str) or not student.strip() or student.startswith(".") \
            or "/" in student or "\\" in student or "\0" in student:
        # the id names folders of the scratch course: nothing may lead out of it
        if slot is not None:
            slot.close()
        raise SubmissionError(f"student {student!r:.80} cannot be a student id (a path separator, a "
                              "leading dot or an empty name)")
    loaded = None
    if slot is None:
        # A file that is not a gradable notebook is refused before a kernel starts for it (in
        # well under a second, not the seconds a kernel and torch take).
        loaded = load(path, chapter)
        slot = KernelSlot(sandboxed, private)
    # The kernel boots in its own process while this one imports nbgrader and torch.
    try:
        import torch
        torch.set_num_threads(1)  # the reference and the judge, as the kernel (OMP_NUM_THREADS=1): parallel workers do not fight over cores
        nb, info = loaded or load(path, chapter)
        return _grade_in(slot.work, slot.kernel, nb, info, student, feedback, keep_course)
    finally:
        slot.close()


def _autograde_failure(result: dict) -> str:
    """Why nbgrader's autograde failed (its API's RESULT): the last exception its log shows other
    than its own summary (NbGraderException, "see the above traceback", which is all of RESULT's
    "error"), else the end of that error or log."""
    text = (result.get("log") or "") + "\n" + (result.get("error") or "")
    raised = [line.strip() for line in text.splitlines()
              if re.match(r"\s*[\w.]*(Error|Exception|Interrupt|Exit)\b", line) and "NbGraderException" not in line]
    return raised[-1] if raised else text.strip()[-300:]


def _grade_in(work, kernel, nb, info, student, feedback, keep_course):
    from .session import GradingSession

    session = GradingSession.in_kernel(info, kernel.exchange, work / "private", kernel)
    try:
        return _graded(session, work, kernel, nb, info, student, feedback, keep_course)
    finally:
        session.close()  # its stand-in process, whatever happened


def _graded(session, work, kernel, nb, info, student, feedback, keep_course):
    import nbformat

    from coursekit import conventions, nbgrader_course

    from .feedback import render as render_feedback
    from .feedback import scores_page
    from .execute import GuardedExecute
    from .judged_grades import Judgement
    from .report import Report
    from .static_check import static_builtin_use, substituted_dependencies
    from .submission import repaired
    from .template import course_template

    template = course_template(info)
    course = work / "course"
    shutil.copytree(template, course)
    release = nbformat.read(template / "release" / info.name / f"{info.name}.ipynb", as_version=4)
    # every cell the learner can edit or add, told from the release's own cells
    static = static_builtin_use(nb, session.hidden.from_scratch, release, substituted_dependencies(session),
                                kernel_only=session.hidden.kernel_only)
    clean, repairs = repaired(nb, release)
    submitted = course / "submitted" / student / info.name
    submitted.mkdir(parents=True)
    nbformat.write(clean, submitted / f"{info.name}.ipynb")

    judgement = Judgement(session, static, kernel)
    cfg = _autograde_config(course, GuardedExecute.for_run(session, kernel), judgement)
    api = nbgrader_course.api(course, cfg)
    result = api.autograde(info.name, student, force=True, create=True)
    autograded = course / "autograded" / student / info.name / f"{info.name}.ipynb"
    if not autograded.exists():
        why = kernel.start_failure() or _autograde_failure(result)
        raise RuntimeError("nbgrader autograde produced no notebook: " + why[:300].replace("\n", " "))

    outcomes = judgement.outcomes
    if outcomes is None:
        raise RuntimeError("nbgrader autograde finished without judging the test cells")
    report = Report(info.name, student, outcomes, repairs=repairs, sandboxed=kernel.sandboxed,
                    enforcement=kernel.enforcement, language=info.language,
                    written=conventions.written_answers(clean))  # graded by hand: outside the score
    if feedback or keep_course is not None:
        report.feedback_page = render_feedback(course, info, student, autograded, outcomes,
                                               "\n".join(c.source for c in nb.cells)) or \
            scores_page(student, info.name, outcomes, info.language)
    if keep_course is not None:
        shutil.copytree(course, keep_course, dirs_exist_ok=True)
    return report


def _autograde_config(course: Path, execute_class, judgement):
    """nbgrader's autograde steps, with the hardened execute step, then the judge, and the
    judge's scores saved in place of nbgrader's own."""
    from nbgrader.converters.autograde import Autograde

    from coursekit import nbgrader_course

    from .judged_grades import JudgeCells, SaveJudgedGrades
    c = nbgrader_course.config(course)
    c.Execute.timeout = int(settings.current().cell_timeout)
    c.Execute.startup_timeout = 120
    steps = []
    for step in Autograde.class_traits()["autograde_preprocessors"].default():
        if step.__name__ == "Execute":
            steps += [execute_class, JudgeCells.for_run(judgement)]
        elif step.__name__ == "SaveAutoGrades":
            steps.append(SaveJudgedGrades.for_run(judgement))
        else:
            steps.append(step)
    if sum(s.__name__ in ("JudgeCells", "SaveJudgedGrades") for s in steps) != 2:
        raise RuntimeError("nbgrader's autograde steps changed: no Execute or SaveAutoGrades to replace")
    c.Autograde.autograde_preprocessors = steps
    return c
