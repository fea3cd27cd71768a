"""Late work: a due date per chapter and a late policy, kept where nbgrader keeps them.

The due date is the chapter's ``Assignment.duedate`` in the gradebook (what ``nbgrader db
assignment add --duedate`` sets); the policy is the class folder's ``nbgrader_config.py``:
nbgrader's own ``LateSubmissionPlugin`` (``none``, or ``zero``: a late submission scores 0) or
``PenaltyPerPeriod`` below (points off per started hour or day late, nbgrader's SubMarks example).
nbgrader's ``AssignLatePenalties`` step applies it (``gradebook.assign_late_penalty``) and keeps a
penalty between 0 and the notebook's score.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from nbgrader.plugins import BasePlugin
from traitlets import Enum, Float

POLICY = re.compile(r"(?P<points>\d+(\.\d+)?)/(?P<period>hour|day)")
BEGIN, END = "# late policy (release --late", "# end of the late policy"


class PenaltyPerPeriod(BasePlugin):
    """POINTS off for each started PERIOD (hour or day) a submission is late."""
    points = Float(1.0, help="points off per period").tag(config=True)
    period = Enum(("hour", "day"), default_value="day", help="hour or day").tag(config=True)

    def late_submission_penalty(self, student_id, score, total_seconds_late):
        seconds = 3600 if self.period == "hour" else 86400
        return self.points * math.ceil(total_seconds_late / seconds) if total_seconds_late > 0 else None


def policy_lines(policy: str) -> list[str]:
    """The nbgrader_config.py lines of a --late policy: none, zero, P/hour or P/day."""
    if policy in ("none", "zero"):
        return [f"c.LateSubmissionPlugin.penalty_method = {policy!r}"]
    match = POLICY.fullmatch(policy)
    if not match:
        raise ValueError(f"--late {policy}: takes none, zero (a late submission scores 0), "
                         "or points off per started hour or day late, e.g. 2/day or 0.5/hour")
    return ["c.AssignLatePenalties.plugin_class = 'autograder.classroom.late.PenaltyPerPeriod'",
            f"c.PenaltyPerPeriod.points = {float(match['points'])!r}",
            f"c.PenaltyPerPeriod.period = {match['period']!r}"]


def set_policy(course: Path, policy: str) -> None:
    """Write POLICY into COURSE/nbgrader_config.py, in place of an earlier one."""
    lines = policy_lines(policy)
    config = Path(course) / "nbgrader_config.py"
    text = config.read_text() if config.exists() else "c = get_config()\n"
    text = re.sub(rf"\n?{re.escape(BEGIN)}.*?{re.escape(END)}\n", "\n", text, flags=re.S).rstrip("\n") + "\n"
    config.write_text(text + f"{BEGIN} {policy})\n" + "\n".join(lines) + f"\n{END}\n")


def policy_text(course: Path) -> str:
    """The late policy's lines of COURSE/nbgrader_config.py (part of a grading's version)."""
    config = Path(course) / "nbgrader_config.py"
    text = config.read_text() if config.is_file() else ""
    return "\n".join(line for line in text.splitlines() if "Late" in line or "late" in line or "PenaltyPer" in line)


def parse_due(item: str):
    """CHAPTER=YYYY-MM-DDTHH:MM[+zone] -> (chapter, naive UTC datetime); no zone means UTC, as nbgrader."""
    from nbgrader.utils import parse_utc
    chapter, eq, when = item.partition("=")
    if not (eq and chapter and when):
        raise ValueError(f"--due {item}: takes CHAPTER=YYYY-MM-DDTHH:MM[+HH:MM], e.g. 02_self_attention=2026-03-01T23:59+01:00")
    try:
        return chapter, parse_utc(when)
    except (ValueError, OverflowError):
        raise ValueError(f"--due {item}: {when} is not a time (YYYY-MM-DDTHH:MM[+HH:MM])") from None


def set_due(course: Path, chapter: str, due) -> None:
    from coursekit.nbgrader_course import gradebook
    with gradebook(course) as gb:
        gb.update_or_create_assignment(chapter, duedate=due)


def copy_settings(course: Path, out: Path, chapters) -> None:
    """The due dates and late policy of COURSE into a results folder OUT (a shard's --out)."""
    import sqlite3
    from nbgrader.utils import parse_utc
    path = Path(course) / "gradebook.db"
    if path.exists():
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            due = dict(con.execute("SELECT name, duedate FROM assignment WHERE duedate IS NOT NULL"))
        finally:
            con.close()
        for chapter in chapters:
            if due.get(chapter):
                set_due(out, chapter, parse_utc(due[chapter]))
    config = Path(course) / "nbgrader_config.py"
    text = config.read_text() if config.is_file() else ""
    block = re.search(rf"{re.escape(BEGIN)} (?P<policy>.*?)\)\n", text)
    if block:
        set_policy(out, block["policy"])
