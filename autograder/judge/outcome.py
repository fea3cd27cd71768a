"""A test cell's outcome as data: what the judge found, carried whole to every reader.

The spec's JSON flattens each verdict into a feedback line ("test (score/points): message");
the grader's own tools (the class run's ledger, the class and similarity reports, the catalogs)
read these fields instead (``TestOutcome.as_dict``), never that line.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Verdict:
    """One thing a test found wrong."""

    message: str              # as the learner reads it (a ``Message``: told in the submission's language)
    # The chapter's own words for what is wrong, when the verdict is theirs: the message of a
    # ``Mistake`` the submission reproduces, a check's hint, a memory rule. None: the grader's own finding.
    mistake: str | None = None
    label: str = ""           # the probe's label (the case it was found on), if it was found on one
    # The message without what belongs to the one case (the probe's label, the error's text, a
    # measurement): what the class report counts as one mistake. "": the chapter's words, else the message.
    what: str = ""

    def __post_init__(self):
        self.what = self.what or self.mistake or self.message


@dataclasses.dataclass
class TestOutcome:
    test_id: str
    exercise: str
    points: float
    score: float
    verdicts: list[Verdict]   # empty: the test passed

    @property
    def problems(self) -> list[str]:
        """The verdicts' messages, in order (the feedback lines' text)."""
        return [v.message for v in self.verdicts]

    def as_dict(self) -> dict:
        """{"test_id", "exercise", "points", "score", "verdicts": [{"message", "mistake", "label", "what"}]}."""
        return dataclasses.asdict(self)
