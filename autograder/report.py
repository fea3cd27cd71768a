"""A graded submission as the spec's JSON and as a readable text report."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # verdicts imports torch: keep this module light
    from .verdicts import TestOutcome

UNSANDBOXED_NOTE = "graded WITHOUT the OS sandbox (--unsandboxed): only the audit hook contained the code"


@dataclasses.dataclass
class Report:
    chapter: str
    student: str
    outcomes: list[TestOutcome]
    feedback_html: Path | None = None
    repairs: list[str] = dataclasses.field(default_factory=list)
    sandboxed: bool = True

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

    def as_text(self) -> str:
        data = self.as_json()
        lines = [f"{data['notebook']}: {data['score']:g} / {data['max_score']:g} points"]
        if not self.sandboxed:
            lines.append(f"note: {UNSANDBOXED_NOTE}")
        for name, ex in data["exercises"].items():
            lines.append(f"\n{name}: {ex['score']:g} / {ex['max_score']:g}")
            lines += [f"  {line}" for line in ex["feedback"]]
        if self.repairs:
            lines.append("\nrepaired before grading: " + "; ".join(self.repairs))
        if self.feedback_html:
            lines.append(f"\nfeedback: {self.feedback_html}")
        return "\n".join(lines)
