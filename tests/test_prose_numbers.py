"""Numbers in a chapter's prose that an experiment measures are glued, never typed.

CHAPTER_GUIDE.md ("Honesty"): every number the prose quotes from an experiment comes
from the executed cell through MyST-NB's ``glue``. A typed copy goes stale the day the
experiment changes (Chapter 5 said "about 0.2 million parameters" next to a glued
parameter count; Chapter 7 said "1,500 times its parameters" where the book's own
numbers give about 1,130). Executing the chapters is too slow for these checks, so
they read the sources in ``course/``, and the glued values where a run left them:

* every ``{glue:...}`name``` role in the prose names a ``glue("name", ...)`` call of
  the same chapter (a typo would render as an error in the book);
* every number in the prose that carries the unit of a measured quantity (a count of
  parameters, "N times faster/more/as many ...", a percentage, a duration in seconds or
  minutes, a size in KiB/MiB/GiB/MB/GB) is either a glue role or listed in ``TYPED``
  below with the reason it may be typed: a published figure, a definition, a threshold
  the text sets, arithmetic the text shows, or the reader's time estimate that the
  guide asks every opening for;
* in the run the book build cached in ``_build/executed/`` (this check is in the full
  tier, after the build: ``test_book.book``), no number typed in the prose
  equals a glued value of that run, as the prose would round it ("0.2 million" against
  a glued count of 2xx,xxx, "5.9" against a glued 5.87). Numbers of one significant
  digit without "million"/"billion"/"%" (100 tokens, p = 0.1) are too common to judge,
  and a whole number without a unit is compared with glued whole numbers only; a number
  the text sets that a run happens to glue too is listed in ``COINCIDENCES``.

What it does not catch: a measured number without such a unit ("a loss of 1.77", "the
weight 0.42"), and a typed number that a list entry already covers. Math (``$...$``),
code spans, links and the references are not prose here.
"""
from __future__ import annotations

import ast
import re

import nbformat
import pytest

from coursegen import chapters
from coursegen.book import EXEC_CACHE, glued_outputs
from coursegen.book import cached_run as book_cached_run
from test_book import book  # noqa: F401 - the built book, for the tests that read its runs

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
    ("06_efficient_attention", "1 GiB"): "arithmetic shown beside it: 16,384^2 float32 numbers",
    ("06_efficient_attention", "128 MiB"): "arithmetic: two 4096 x 4096 float32 matrices",
    ("06_efficient_attention", "four times the"): "arithmetic: error ~ 1/sqrt(m), halved by 4 m",
    ("07_gpt", "500 MB"): "size of the published GPT-2 small checkpoint, not measured here",
    ("07_gpt", "2 minutes"): "time estimate for the reader (opening)",
    ("07_gpt", "175 billion parameters"): "GPT-3's published size (Brown et al., 2020)",
    ("07_gpt", "40 GB"): "GPT-2's training data as published (Radford et al., 2019)",
    ("07_gpt", "90%"): "definition: the nucleus with p = 0.9",
    ("07_gpt", "140 GB"): "arithmetic: 70 billion 16-bit weights",
    ("07_gpt", "72 KiB"): "arithmetic shown in the answer",
    ("08_modern_attention", "2 minutes"): "time estimate for the reader (opening)",
    ("08_modern_attention", "1.5 GB"): "size of the published Qwen3-0.6B checkpoint, not measured here",
    ("08_modern_attention", "22.2 times less"): "StreamingLLM's published speed-up (Xiao et al., 2024)",
    ("08_modern_attention", "20.4%"): "published figure: cache used by earlier systems (Kwon et al., 2023)",
    ("08_modern_attention", "38.2%"): "published figure: cache used by earlier systems (Kwon et al., 2023)",
    ("08_modern_attention", "93.3%"): "DeepSeek-V2's published claim, which the chapter checks",
    ("08_modern_attention", "68.6 KiB"): "arithmetic shown in the answer",
    ("08_modern_attention", "244 KiB"): "arithmetic shown in the answer",
    ("08_modern_attention", "several times smaller"): "what GQA does by definition (h / h_kv), in the overview table",
    ("08_modern_attention", "8 times the"): "a length the text sets: a stream of 512 characters against a context of 64",
    ("08_modern_attention", "16 times fewer"): "arithmetic shown in the answer: 8 key heads against 128",
    ("09_beyond_text", "2 minutes"): "time estimate for the reader (opening)",
    ("09_beyond_text", "256 MiB"): "a threshold the text sets: the chapter's memory budget for one layer",
    ("09_beyond_text", "10%"): "definition: the fractions of the training split the experiment sets",
    ("09_beyond_text", "25%"): "definition: the fractions of the training split the experiment sets",
    ("09_beyond_text", "50%"): "definition: the fractions of the training split the experiment sets",
    ("09_beyond_text", "100%"): "definition: the fractions of the training split the experiment sets",
    ("09_beyond_text", "15 times the"): "arithmetic: 65^2 / 17^2 attention scores, one-pixel against 2x2 patches",
    ("09_beyond_text", "196 times more"): "arithmetic shown in the answer: 50,176 inputs against 256 latents",
    ("09_beyond_text", "four times the"): "arithmetic: (224/16)^2 = 196 tokens against (224/32)^2 = 49",
    ("10_attention_kernels", "1 minute"): "time estimate for the reader (opening)",
    ("10_attention_kernels", "3.35 TB"): "a published figure: the H100 SXM's HBM3 bandwidth (NVIDIA's datasheet)",
    ("10_attention_kernels", "2.0 TB"): "a published figure: the A100 SXM's memory bandwidth (NVIDIA's datasheet)",
    ("10_attention_kernels", "80 ms"): "a published figure: CS336's leaderboard baseline (issue 51)",
    ("10_attention_kernels", "5.4 ms"): "a published figure: CS336's leaderboard best entry (issue 51)",
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
    text = re.sub(r"^(#+\s+)\d+\.", r"\1", text, flags=re.M)     # section numbers
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
        if cell.kind in ("markdown", "written", "hidden", "test", "include"):
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


# (chapter, a number as the prose writes it) -> why it equals a glued value by chance.
COINCIDENCES = {
    ("01_bahdanau_attention", "2.5"): "the reader's time estimate (2.5 hours); the glued dot_len_second is 2.5 too",
    ("06_efficient_attention", "128"): "sizes the text sets (128 MiB, a window radius, a head width); "
                                       "the glued window_layers happens to be 128 too",
    ("06_efficient_attention", "0.25"): "the Performer scale the text sets; the glued lsh_plain4_90 rounds to it",
    ("04_positional_encoding", "32"): "d_model = 32, which the text sets; the glued rope_until (a measured "
                                      "length) is 32 too",
    ("10_attention_kernels", "16"): "tile sizes, head widths and block sizes the text sets (16, 32, 64); the "
                                    "decoding section's glued decode_program_mib, decode_programs and "
                                    "decode_splits happen to be 16, 32 and 64",
    ("09_beyond_text", "10%"): "the share of the training images the text sets (10%, 25%, 50%); the glued "
                               "acc_pixels, chance for ten digits, can round to 0.10",
    ("10_attention_kernels", "32"): "tile sizes and head widths the text sets; the glued decode_programs is 32 too",
    ("10_attention_kernels", "64"): "tile sizes and head widths the text sets; the glued decode_splits is 64 too",
    ("08_modern_attention", "128"): "sizes the text sets (128 heads, head widths of 128 in published configs); "
                                    "the glued llama_token_kib (KiB per token) is 128 too",
    ("08_modern_attention", "32"): "sizes the text sets (a cache of 32 tokens, the prompt's first 32 tokens); the "
                                   "glued contig_gib happens to be 32 too",
    ("08_modern_attention", "576"): "DeepSeek-V3's published 512 + 64 in the question; the glued v3_elems is its sum",
}
# Timings change from run to run (and machine to machine): a typed number that equals one is chance,
# and judging them would make this test fail on some runs and pass on others.
TIMING = re.compile(r"seconds|(^|_)ms(_|$)|time|speedup|exponent|slope|vs_sdpa")


def glued_numbers(nb) -> dict[str, float]:
    """The numeric values a run glued, by name (numbers glued as formatted strings too)."""
    values = {}
    for name, output in glued_outputs(nb).items():
        plain = next((v for k, v in output["data"].items() if k.endswith("text/plain")), "")
        try:
            value = ast.literal_eval(plain)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str):
            try:
                value = float(value.replace(",", ""))
            except ValueError:
                continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value and not TIMING.search(name):
            values[name] = float(value)
    return values


NUMBER_IN_PROSE = re.compile(r"(?<!version )(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d++)?(?=\s*(%|million\b|billion\b)|(?![\w.,]\d))")  # not 3.2 of Section 3.2.3
SCALES = {"%": 0.01, "million": 1e6, "billion": 1e9}


def typed_copies(text: str, values: dict[str, float]) -> list[str]:
    """Numbers in TEXT that equal a value of VALUES rounded as the text writes them."""
    found = []
    for match in NUMBER_IN_PROSE.finditer(text):
        whole, fraction, unit = match.group(1), match.group(2) or "", match.group(3)
        digits = (whole.replace(",", "") + fraction[1:]).strip("0")
        if unit is None and len(digits) < 2:
            continue                                  # 100 tokens, p = 0.1: too common to judge
        number, decimals = float(whole.replace(",", "") + fraction), max(len(fraction) - 1, 0)
        for name, value in values.items():
            if unit is None and not fraction and value != int(value):
                continue                              # 64 heads, 2017 against a glued 64.2: chance
            if round(value / SCALES.get(unit, 1), decimals) == number:
                found.append(f"{whole}{fraction}{' ' + unit if unit and unit != '%' else unit or ''} (glued: {name})")
    return found


def cached_run(name):
    """The book's cached run of the chapter as it is now (None if the build left none)."""
    path = book_cached_run(CHAPTERS[name])
    return nbformat.read(path, as_version=4) if path.exists() else None


@pytest.mark.parametrize("name", CHAPTERS)
def test_no_typed_copy_of_a_glued_value(book, name):
    run = cached_run(name)
    assert run is not None, f"the book build left no run of the current {name} in {EXEC_CACHE}"
    copies = [c for c in typed_copies(prose(CHAPTERS[name]), glued_numbers(run))
              if (name, c.split(" (")[0]) not in COINCIDENCES]
    assert not copies, f"{name}: numbers typed into the prose that the run glues: {copies}; quote the glue instead"


@pytest.mark.parametrize("text, values, caught", [
    ("about 0.2 million parameters", {"params": 213_000}, ["0.2 million (glued: params)"]),
    ("a perplexity of 5.9 against", {"ppl": 5.87}, ["5.9 (glued: ppl)"]),
    ("reaches 97% in 1,128 steps", {"acc": 0.9712, "steps": 1128}, ["97% (glued: acc)", "1,128 (glued: steps)"]),
    ("100 tokens, p = 0.1, 64 heads, in 2017", {"n": 100, "p": 0.1, "h": 64.2, "year": 2017.4}, []),
    ("the paper's Section 3.2.3, version 1.12.0", {"a": 3.2, "b": 2.3, "c": 1.12}, []),
    ("since PyTorch version 2.5, a safe softmax", {"slope_fit": 2.5}, []),
])
def test_typed_copies_are_found(text, values, caught):
    assert typed_copies(text, values) == caught


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
