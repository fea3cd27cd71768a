"""A visible test that stops on an error in the learner's code says so in one line, before its traceback.

An ``IndexError`` in the learner's ``paged_attention`` used to show as a bare traceback that
named neither the test nor what it checks. Now the learner notebook's setup cell (the given cell
that defines ``glue``) installs an IPython exception handler (``set_custom_exc``; ipykernel's
shell, so Jupyter, Colab and VS Code alike) that, when a visible test cell stops on anything but
an ``AssertionError``, puts one line first: the test's name, the function the traceback shows in
the notebook's code and the exception it raised, and the test's docstring (what it checks, the
likely place to look). The traceback follows it unchanged, and the cell still fails (IPython
records the error, so nbgrader and "Run all" stop as before). Assertions keep their own messages.

A visible test cell is known by its first line, ``# Visible test test_NAME`` (``marker``, added
to every test cell by ``coursegen.build``). The handler is in the learner notebook only: the book
runs the instructor notebook's given code, and grading drops given cells (the hidden tests run
outside this kernel; their points do not depend on what the visible part prints).

The handler's words are in ``feedback.po`` (``units``, read by ``coursegen.feedback_texts``); the
caller passes the edition's translations (``found``).
"""
from __future__ import annotations

import re
from pathlib import Path

MARKER = "Visible test {test}"
COMMENT = ("A visible test that stops on an error other than its own assertions (an IndexError in your\n"
           "code, say) first says which test stopped, which function raised what, and what the test\n"
           "checks; the traceback follows.")
RAISED = ("Visible test {test} stopped on an error in your code: `{function}` raised {error}. "
          "What the test checks, the likely place to look: {check}")
NOT_WRITTEN = ("Visible test {test} stopped: `{function}` is not written yet (it raises NotImplementedError). "
               "Write it, run its cell, then this test again. What the test checks: {check}")
OWN_LINES = ("Visible test {test} stopped on {error}, in the test's own lines: look at what your code "
             "returned. What the test checks, the likely place to look: {check}")
TEXTS = ("MARKER", "COMMENT", "RAISED", "NOT_WRITTEN", "OWN_LINES")

# Appended to the setup cell; {comment} and the messages are the edition's.
HANDLER = '''

{comment}
_VISIBLE_TEST_STOPS = dict(
    raised={raised!r},
    not_written={not_written!r},
    own_lines={own_lines!r},
)


def _visible_test_stopped(shell, etype, value, tb, tb_offset=None):
    import ast, linecache, re, sys, traceback
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
    stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    frames = [frame.f_code for frame, _ in traceback.walk_tb(tb) if frame.f_globals is shell.user_ns]
    cell = "".join(linecache.getlines(frames[0].co_filename)) if frames else ""
    test = re.match(r"# .*\\b(test_\\w+)\\n", cell)
    if test and not issubclass(etype, AssertionError):
        try:
            called = [getattr(code, "co_qualname", code.co_name) for code in frames
                      if code.co_filename != frames[0].co_filename and not code.co_name.startswith("<")]
            found = dict(test=test[1], check=" ".join((ast.get_docstring(ast.parse(cell)) or "").split()),
                         error=" ".join(f"{{etype.__name__}}: {{value}}".split()).rstrip(":"))
            if called and etype is NotImplementedError and not str(value):
                line = _VISIBLE_TEST_STOPS["not_written"].format(function=called[-1], **found)
            elif called:
                line = _VISIBLE_TEST_STOPS["raised"].format(function=" → ".join(dict.fromkeys(called)), **found)
            else:
                line = _VISIBLE_TEST_STOPS["own_lines"].format(**found)
            stb = [line, *stb]
        except Exception:
            pass
    shell._showtraceback(etype, value, stb)


try:
    get_ipython().set_custom_exc((Exception,), _visible_test_stopped)
except NameError:
    pass'''
SETUP_CELL = re.compile(r"^def glue\(", re.M)  # the setup cell defines the learner notebook's glue


def _in(found):
    """The edition's wording of a text: FOUND (its translations' ``get``) or, without one, the English."""
    return lambda text: (found(text) if found else None) or text


def marker(test_id: str, found=None) -> str:
    """The first line of a visible test cell: the comment that names it (and that the handler reads)."""
    return "# " + _in(found)(MARKER).format(test=test_id)


def handler_source(found=None) -> str:
    """The code the setup cell ends with: the handler, in the edition's words, and its installation."""
    told = _in(found)
    comment = "\n".join("# " + line for line in told(COMMENT).split("\n"))
    return HANDLER.format(comment=comment, raised=told(RAISED), not_written=told(NOT_WRITTEN),
                          own_lines=told(OWN_LINES))


def with_stop_report(nb, found=None):
    """NB (a learner notebook, its glue already the printing one) with the handler at the end of its
    setup cell, in the words FOUND gives; changed in place."""
    setup = next(cell for cell in nb.cells if cell.cell_type == "code" and "nbgrader" not in cell.metadata
                 and SETUP_CELL.search(cell.source))
    setup.source = setup.source.rstrip("\n") + handler_source(found)
    return nb


def units() -> list[tuple[str, str]]:
    """(entry, "file:line") of each text the handler and the test cells' first lines show."""
    lines = Path(__file__).read_text().splitlines()

    def line_of(name):
        return next(number for number, line in enumerate(lines, 1) if line.startswith(f"{name} = "))
    return [(globals()[name], f"coursegen/visible_test_errors.py:{line_of(name)}") for name in TEXTS]
