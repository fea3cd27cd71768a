"""A graded submission as the spec's JSON and as a readable text report."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from coursekit.conventions import SOURCE_LANGUAGE

from .messages import msg, tell

if TYPE_CHECKING:
    from .judge.outcome import TestOutcome

UNSANDBOXED_NOTE = msg("graded WITHOUT the OS sandbox (--unsandboxed): only the audit hook contained the code")


@dataclasses.dataclass
class Report:
    chapter: str
    student: str
    outcomes: list[TestOutcome]
    feedback_page: str | None = None  # the feedback page's HTML, when it was asked for
    feedback_html: Path | None = None  # where the page was written
    repairs: list[str] = dataclasses.field(default_factory=list)
    sandboxed: bool = True
    enforcement: str | None = None  # what stopped memory and tasks at their limits: 'cgroup v1|v2' or 'watchdog'
    language: str = SOURCE_LANGUAGE  # the submission's edition: the text report is told in it
    # grade id -> {"max_score", "answered"} of each written answer (``conventions.written_answers``);
    # None: the chapter's, each taken as answered
    written: dict[str, dict] | None = None

    def by_hand(self) -> dict:
        """The written answers: graded by hand (formgrader), so outside the automatic score, and not lost.

        ``pending`` is the points of those answered, which a grader has still to score; an answer
        left as its prompt is scored 0 by nbgrader itself (``answered``: false)."""
        answers = self.written
        if answers is None:
            from .chapters import known
            info = known().get(self.chapter)
            answers = {g: {"max_score": p, "answered": True} for g, p in (info.written if info else {}).items()}
        return {"max_score": sum(a["max_score"] for a in answers.values()),
                "pending": sum(a["max_score"] for a in answers.values() if a["answered"]),
                "answers": {g: dict(a) for g, a in answers.items()}}

    def as_json(self) -> dict:
        """The spec's JSON: the same keys and English messages whatever the submission's language."""
        exercises: dict[str, dict] = {}
        for o in self.outcomes:
            entry = exercises.setdefault(o.exercise, {"score": 0.0, "max_score": 0.0, "feedback": []})
            entry["score"] += o.score
            entry["max_score"] += o.points
            if o.problems:
                entry["feedback"] += [f"{o.test_id} ({o.score:g}/{o.points:g}): {p}" for p in o.problems]
            else:
                entry["feedback"].append(f"{o.test_id} ({o.score:g}/{o.points:g}): passed")
        data = {"notebook": self.chapter,
                "score": sum(o.score for o in self.outcomes),
                "max_score": sum(o.points for o in self.outcomes),
                "exercises": exercises}
        by_hand = self.by_hand()
        if by_hand["answers"]:  # not in score or max_score: those are the automatic part
            data["by_hand"] = by_hand
        return data

    def as_result(self) -> dict:
        """For the grader's own tools (a class run's ledger, the catalogs): the spec's JSON and
        ``outcomes``, each test's ``TestOutcome.as_dict``, whose fields they read instead of the feedback lines."""
        return {**self.as_json(), "outcomes": [o.as_dict() for o in self.outcomes]}

    def limits_note(self) -> str | None:
        """How the sandbox's limits were held (an instructor's fact, for the grader's log; never in the
        learner's report)."""
        if not self.sandboxed or not self.enforcement:
            return None
        if self.enforcement == "watchdog":
            return tell(msg("note: the sandbox's memory and task limits were polled by the grader "
                            "(no writable cgroup here), not enforced by the kernel"), self.language)
        return tell(msg("note: the kernel enforced the sandbox's memory and task limits ({how})",
                        how=self.enforcement), self.language)

    def as_text(self) -> str:
        """The report for people, in the submission's language."""
        data = self.as_json()

        def told(message):
            return tell(message, self.language)
        lines = [told(msg("{notebook}: {score} / {max_score} points", notebook=data["notebook"],
                          score=f"{data['score']:g}", max_score=f"{data['max_score']:g}"))]
        by_hand = data.get("by_hand")
        if by_hand:
            lines.append(told(msg("automatic: {score} / {max_score}; by hand: {pending} points pending",
                                  score=f"{data['score']:g}", max_score=f"{data['max_score']:g}",
                                  pending=f"{by_hand['pending']:g}")))
        if not self.sandboxed:
            lines.append(told(msg("note: {note}", note=UNSANDBOXED_NOTE)))
        for name, ex in data["exercises"].items():
            lines.append(f"\n{name}: {ex['score']:g} / {ex['max_score']:g}")
            for o in (o for o in self.outcomes if o.exercise == name):
                head = f"{o.test_id} ({o.score:g}/{o.points:g}): "
                lines += [f"  {head}{tell(p, self.language)}" for p in o.problems] or \
                    [f"  {head}{told(msg('passed'))}"]
        if by_hand:
            lines.append("\n" + told(msg("written answers, graded by hand (not in the score above):")))
            for grade_id, answer in by_hand["answers"].items():
                points = f"{answer['max_score']:g}"
                lines.append(f"  {grade_id}: " + (
                    told(msg("to be graded by hand ({points} points)", points=points)) if answer["answered"] else
                    told(msg("not answered (the cell still holds its prompt): 0 / {points}", points=points))))
        if self.repairs:
            lines.append("\n" + told(msg("repaired before grading: {notes}",
                                         notes="; ".join(tell(r, self.language) for r in self.repairs))))
        if self.feedback_html:
            lines.append("\n" + told(msg("feedback: {path}", path=str(self.feedback_html))))
        return "\n".join(lines)
