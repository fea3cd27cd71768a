"""Numbers in a chapter's prose that an experiment measures are glued, never typed.

CHAPTER_GUIDE.md ("Honesty"): every number the prose quotes from an experiment comes
from the executed cell through MyST-NB's ``glue``. A typed copy goes stale the day the
experiment changes (Chapter 5 said "about 0.2 million parameters" next to a glued
parameter count; Chapter 7 said "1,500 times its parameters" where the book's own
numbers give about 1,130). Executing the chapters is too slow for ``make test``, so
these checks read the sources in ``course/`` only:

* every ``{glue:...}`name``` role in the prose names a ``glue("name", ...)`` call of
  the same chapter (a typo would render as an error in the book);
* every number in the prose that carries the unit of a measured quantity (a count of
  parameters, "N times faster/more/as many ...", a percentage, a duration in seconds or
  minutes, a size in KiB/MiB/GiB/MB/GB) is either a glue role or listed in ``TYPED``
  below with the reason it may be typed: a published figure, a definition, a threshold
  the text sets, arithmetic the text shows, or the reader's time estimate that the
  guide asks every opening for.

What it does not catch: a measured number without such a unit ("a loss of 1.77", "the
weight 0.42"), and a typed number that a list entry already covers. Math (``$...$``),
code spans, links and the references are not prose here.
"""
from __future__ import annotations

import ast
import re

import pytest

from coursegen import chapters

CHAPTERS = {chapter.name: chapter for chapter in chapters()}

# (chapter, the number with its unit as the prose writes it) -> why it may be typed.
TYPED = {
    ("01_bahdanau_attention", "a minute"): "time estimate for the reader (opening)",
    ("01_bahdanau_attention", "three minutes"): "time estimate for the reader (opening)",
    ("01_bahdanau_attention", "10%"): "definition: chance for one of ten digits",
    ("01_bahdanau_attention", "99%"): "threshold the experiment sets (steps to 99%)",
    ("02_self_attention", "a minute"): "time estimate for the reader (opening)",
    ("02_self_attention", "six parameters"): "a count of the visible test's tensors, not a measurement",
    ("03_multi_head_attention", "a few seconds"): "time estimate for the reader (opening)",
    ("03_multi_head_attention", "a minute"): "time estimate for the reader (opening)",
    ("03_multi_head_attention", "ten seconds"): "time estimate for the reader (opening)",
    ("04_positional_encoding", "a minute"): "time estimate for the reader (opening)",
    ("05_transformer", "two minutes"): "time estimate for the reader (opening)",
    ("05_transformer", "99%"): "threshold a challenge sets",
    ("06_efficient_attention", "3 minutes"): "time estimate for the reader (opening)",
    ("06_efficient_attention", "128 MiB"): "arithmetic: two 4096 x 4096 float32 matrices",
    ("06_efficient_attention", "four times the"): "arithmetic: error ~ 1/sqrt(m), halved by 4 m",
    ("07_gpt", "500 MB"): "size of the published GPT-2 small checkpoint, not measured here",
    ("07_gpt", "2 minutes"): "time estimate for the reader (opening)",
    ("07_gpt", "175 billion parameters"): "GPT-3's published size (Brown et al., 2020)",
    ("07_gpt", "40 GB"): "GPT-2's training data as published (Radford et al., 2019)",
    ("07_gpt", "90%"): "definition: the nucleus with p = 0.9",
    ("07_gpt", "140 GB"): "arithmetic: 70 billion 16-bit weights",
    ("07_gpt", "72 KiB"): "arithmetic shown in the answer",
}

_NUMBER = (r"(?<![\w.{`$])(?:\d[\d,]*(?:\.\d+)?|a|an|one|two|three|four|five|six|seven|eight|nine|ten"
           r"|a few|several|half)(?:\s+(?:thousand|million|billion))?")
_UNIT = (r"(?:\s*%|\s+per\s*cent\b|\s+parameters\b|\s+(?:seconds|s|ms|milliseconds?|minutes?)\b"
         r"|\s*[KMGT]i?B\b|\s+times\s+(?:faster|slower|more|fewer|larger|smaller|bigger|less|as|its|the)\b)")
MEASURED = re.compile(_NUMBER + _UNIT, re.I)
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)(?::[^`]*)?`")


def prose(chapter) -> str:
    """The chapter's markdown up to its references, without math, code spans, links and glue roles."""
    text = "\n\n".join(cell.source for cell in chapter.cells if cell.kind == "markdown")
    text = re.split(r"^## References", text, flags=re.M)[0]
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    text = re.sub(r"\$[^$\n]*\$", " ", text)
    text = GLUE_ROLE.sub(" GLUED ", text)
    text = re.sub(r"`[^`\n]*`", " ", text)
    return re.sub(r"<https?://[^>]*>|https?://\S+", " ", text)


def typed_measurements(chapter) -> list[str]:
    return [" ".join(m.group(0).split()) for m in MEASURED.finditer(prose(chapter))]


def glued_names(chapter) -> list[re.Pattern]:
    """The first argument of every glue(...) call in the chapter's code, as a pattern (f-strings too)."""
    names = []
    for cell in chapter.cells:
        if cell.kind in ("markdown", "hidden", "test", "include"):
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "glue" and node.args:
                arg = node.args[0]
                parts = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
                names.append(re.compile("".join(re.escape(p.value) if isinstance(p, ast.Constant) else ".+"
                                                for p in parts)))
    return names


@pytest.mark.parametrize("name", CHAPTERS)
def test_glue_roles_name_glued_values(name):
    chapter = CHAPTERS[name]
    markdown = "\n".join(cell.source for cell in chapter.cells if cell.kind == "markdown")
    glued = glued_names(chapter)
    missing = sorted(r for r in set(GLUE_ROLE.findall(markdown)) if not any(g.fullmatch(r) for g in glued))
    assert not missing, f"{name}: the prose quotes {missing}, which no glue(...) call of the chapter defines"


@pytest.mark.parametrize("name", CHAPTERS)
def test_measured_numbers_in_prose_are_glued(name):
    typed = [t for t in typed_measurements(CHAPTERS[name]) if (name, t) not in TYPED]
    assert not typed, (
        f"{name}: numbers with a measured quantity's unit typed into the prose: {typed}. Glue the value "
        "from the cell that computes it ({glue:text}`name`), or, if it is not a measurement of this "
        "chapter (a published figure, a definition, arithmetic the text shows), add it to TYPED with the reason")


def test_every_listed_exception_is_still_in_the_prose():
    """A stale entry would let the same words come back unchecked."""
    present = {(name, t) for name, chapter in CHAPTERS.items() for t in typed_measurements(chapter)}
    stale = sorted(set(TYPED) - present)
    assert not stale, f"TYPED lists numbers the prose no longer has: {stale}"


@pytest.mark.parametrize("text, caught", [
    ("about 0.2 million parameters.", ["0.2 million parameters"]),
    ("GPT-2 small has 1,500 times its parameters", ["1,500 times its"]),
    ("the date model trains in under a minute", ["a minute"]),
    ("reaches 12.5% and needs 31 s, 4.2 ms or 128 MiB", ["12.5%", "31 s", "4.2 ms", "128 MiB"]),
    ("{glue:text}`acc:.1f`% in {glue:text}`secs:.0f` seconds", []),
    ("$O(N^2)$ memory, the `0.5 s` literal, 12 heads, 3 layers, 2019", []),
])
def test_the_pattern_catches_typed_measurements(text, caught):
    class Cell:
        kind, source = "markdown", text

    class Chapter:
        cells = [Cell()]

    assert typed_measurements(Chapter()) == caught
