"""Every assertion a learner can see teaches: it has a message, and it can fail.

Read from the chapter sources in course/: visible test cells, given code (also the given
parts of exercise cells: the stub's ``__init__``), never the solutions or the hidden tests.
An ``assert`` without a message tells a learner nothing when it fails; one that cannot fail
(``assert True``, ``assert (x, "message")``, ``assert a == a``, ``torch.equal(t, t)``)
checks nothing. The checks are syntactic and cheap; they catch the usual slips.
"""
from __future__ import annotations

import ast
import re

import pytest

from coursegen import chapters

CHAPTERS = {chapter.name: chapter for chapter in chapters()}
VISIBLE = ("test", "code", "export", "exercise")
SOLUTION = re.compile(r"^[ \t]*### BEGIN SOLUTION.*?^[ \t]*### END SOLUTION[^\n]*$", re.M | re.S)
# Comparisons that hold whenever both sides are the same expression.
REFLEXIVE = (ast.Eq, ast.Is, ast.LtE, ast.GtE, ast.In)
# Calls that hold when their first two arguments are the same expression.
SAME_ARGUMENT_CHECKS = {"equal", "allclose", "isclose", "array_equal", "assert_close", "eq", "ge", "le"}


def visible_source(cell) -> str:
    """What a learner sees of a cell: an exercise's solution is a stub (``pass`` keeps it parseable)."""
    return SOLUTION.sub(lambda m: re.match(r"[ \t]*", m.group(0)).group(0) + "pass", cell.source)


def cannot_fail(test: ast.expr) -> str | None:
    """Why this assertion's condition is true whatever the code under test does, or None."""
    if isinstance(test, ast.Constant):
        return "its condition is a constant" if test.value else None
    if isinstance(test, (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.JoinedStr)):
        return "its condition is a non-empty literal (a tuple is always true: `assert (x, 'msg')`)" if (
            getattr(test, "elts", None) or getattr(test, "keys", None) or getattr(test, "values", None)) else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], REFLEXIVE) \
            and not isinstance(test.ops[0], ast.In) and ast.dump(test.left) == ast.dump(test.comparators[0]):
        return "it compares an expression with itself"
    if isinstance(test, ast.Call) and len(test.args) >= 2:
        name = test.func.attr if isinstance(test.func, ast.Attribute) else getattr(test.func, "id", "")
        if name in SAME_ARGUMENT_CHECKS and ast.dump(test.args[0]) == ast.dump(test.args[1]):
            return f"`{name}` compares an expression with itself"
    if isinstance(test, ast.Call) and getattr(test.func, "id", "") == "isinstance" and len(test.args) == 2 \
            and isinstance(test.args[1], ast.Name) and test.args[1].id == "object":
        return "everything is an instance of object"
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        reasons = [cannot_fail(v) for v in test.values]
        return next((r for r in reasons if r), None)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        reasons = [cannot_fail(v) for v in test.values]
        return reasons[0] if all(reasons) else None
    return None


def offenders(chapter) -> list[str]:
    found = []
    for cell in chapter.cells:
        if cell.kind not in VISIBLE:
            continue
        where = cell.name or cell.kind
        for node in ast.walk(ast.parse(visible_source(cell))):
            if not isinstance(node, ast.Assert):
                continue
            line = f"course/{chapter.name}.py:{cell.line + node.lineno} ({where})"
            if node.msg is None:
                found.append(f"{line}: assert without a message: `{ast.unparse(node.test)[:80]}`")
            why = cannot_fail(node.test)
            if why:
                found.append(f"{line}: an assertion that cannot fail ({why}): `{ast.unparse(node.test)[:80]}`")
    return found


@pytest.mark.parametrize("name", CHAPTERS)
def test_visible_assertions_have_a_message_and_can_fail(name):
    problems = offenders(CHAPTERS[name])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("source, reason", [
    ("assert x == y", "without a message"),
    ("assert True, 'm'", "constant"),
    ("assert (a == b, 'the message')", "non-empty literal"),
    ("assert out.shape == out.shape, 'm'", "itself"),
    ("assert torch.allclose(y, y, atol=1e-5), 'm'", "itself"),
    ("assert ok or 1, 'm'", "constant"),
])
def test_the_check_finds_each_kind_of_offender(source, reason):
    class Cell:
        kind, name, line = "test", "test_x", 0
    Cell.source = source

    class Chapter:
        name, cells = "00_example", [Cell]
    assert any(reason in problem for problem in offenders(Chapter)), offenders(Chapter)


def test_a_good_assertion_passes():
    class Cell:
        kind, name, line, source = "test", "test_x", 0, "assert torch.allclose(y, want), 'y differs: check the scale'"

    class Chapter:
        name, cells = "00_example", [Cell]
    assert offenders(Chapter) == [], offenders(Chapter)
