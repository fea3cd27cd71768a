"""The feedback catalog's entries: every message the grader's feedback can show, read from source.

Two sources, both read as text (nothing here imports the grader or runs a hidden test):

* the grader's own messages, each ``msg("template", ...)`` call in ``autograder/``;
* what a chapter's hidden tests can show: mistakes' names, probes' labels, checks' hints
  (their ``return`` values) and memory rules, from the ``# %% [hidden]`` cells of ``course/``.

And the feedback a learner notebook gives itself: the line a visible test that stops on an error
shows first, and the comment naming each visible test (``coursegen.visible_test_errors``).

``coursegen.catalogs`` writes them to ``locales/<lang>/LC_MESSAGES/feedback.po``;
``autograder.messages`` tells them at grading time.
"""
from __future__ import annotations

import ast
import re

from coursekit.conventions import COURSE_DIR, ROOT, chapter_names
from coursekit.source import parse_chapter

from . import visible_test_errors

GRADER_DIR = ROOT / "autograder"
_FIELD = re.compile(r"\{\{|\}\}|\{[^{}]*\}")  # as autograder.messages reads fields back


def _template_of(node: ast.expr) -> str | None:
    """A string literal as a catalog entry: constants as they are, f-strings with {fields}."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace("{", "{{").replace("}", "}}") if "{" in node.value else node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                out.append(value.value.replace("{", "{{").replace("}", "}}"))
            else:
                out.append("{" + _field_source(value) + "}")
        return "".join(out)
    return None


def _field_source(value: ast.FormattedValue) -> str:
    text = ast.unparse(value.value)
    if value.conversion != -1:
        text += "!" + chr(value.conversion)
    if value.format_spec is not None:
        text += ":" + "".join(v.value if isinstance(v, ast.Constant) else "{" + _field_source(v) + "}"
                              for v in value.format_spec.values)
    return text


def _grader_templates() -> list[tuple[str, str]]:
    """Every ``msg("...")`` template in the grader's source (read as text: the grader is not imported)."""
    found = []
    for path in sorted(GRADER_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "msg" \
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value:
                found.append((node.args[0].value, f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"))
    return found


def _hidden_test_texts(name: str) -> list[tuple[str, str]]:
    """What a chapter's hidden tests can show: mistakes' names, labels, hints, memory rules."""
    chapter = parse_chapter(COURSE_DIR / f"{name}.py")
    found = []
    for cell in chapter.of_kind("hidden"):
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            picked = []
            if isinstance(node, ast.Call):
                callee = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if callee == "Mistake" and node.args:
                    picked.append(node.args[0])
                picked += [k.value for k in node.keywords if k.arg in ("label", "message")]
                picked += [k.value.elts[1] for k in node.keywords if k.arg == "max_memory"
                           and isinstance(k.value, ast.Tuple) and len(k.value.elts) == 2]
            elif isinstance(node, ast.Return) and node.value is not None:
                picked.append(node.value)
            for text in filter(None, map(_template_of, picked)):
                if re.search(r"[A-Za-z]{2,}", _FIELD.sub("", text)) and " " in text:
                    found.append((text, f"course/{name}.py:{cell.line + getattr(node, 'lineno', 1)}"))
    return found


def feedback_units() -> list[tuple[str, str]]:
    """(entry, "file:line") of every message the feedback can show, the grader's first."""
    found = _grader_templates()
    for name in chapter_names():
        found += _hidden_test_texts(name)
    return found + visible_test_errors.units()
