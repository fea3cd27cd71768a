"""The course's grader. Other systems grade one notebook with ``autograder.grade_notebook``
(``autograder.api``); it is imported when first asked for, so that importing the package (the
chapters' hidden tests import ``autograder.hidden``) stays light."""

_API = ("grade_notebook", "Report", "SubmissionError", "SandboxUnavailable")


def __getattr__(name):
    if name in _API:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'autograder' has no attribute {name!r}")
