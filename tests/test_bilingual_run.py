"""The book runs each chapter once for both editions (coursegen.bilingual_run, bilingual_kernel).

What a reader sees on a page must come from the run whose outputs that page shows: the two
editions' pages are made from one run, so their numbers cannot disagree. These tests check
the rewrite of a cell, the kernel side (strings in both languages, figures drawn twice, a
missing glyph caught) and, after the book build, that every number either edition's page
prints or glues is the one run's.
"""
from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import warnings

import nbformat
import pytest

from coursegen import bilingual_kernel as K
from coursegen import chapters
from coursegen.bilingual_run import Translator, prelude, run_source
from coursegen.book import executed_chapter, glued_outputs, stage_of
from coursekit.conventions import SOURCE_LANGUAGE, TRANSLATIONS
from test_book import book  # noqa: F401 - the built book, for the tests that read its runs

ENGLISH = '''
import os
def label(ms):
    """The time as shown."""
    return f"{ms:.1f} ms"
stats = {"raw": [0.25], "scaled": [0.5]}
names = ["window", "sinks"]
def pad_to(text, width):
    text = str(text)
    return text + " " * (width - sum(2 if ord(c) > 0x2e80 else 1 for c in text))
for name, ms in zip(names, [1.234, 5.6]):
    print(f"{pad_to(name, 8)} {label(ms)} max {stats['raw'][0]}", "done")
print("  ".join(pad_to(n, 8) for n in names) + "|")
WORDS = dict(wo="wo", ni="ni")
def shown(sentence):
    return " ".join(WORDS.get(w, w) for w in sentence.split())
print(f"-> {pad_to(shown('wo ni'), 8)}|", ", ".join(["x", "y"]), os.sep.join(["a", "b"]))
print(", ".join(names), "%d steps" % 3, "total: {}".format(label(2)))
'''
TRANSLATION = ENGLISH.replace('" ms"', '" 毫秒"').replace('"window", "sinks"', '"窗口", "汇点"') \
    .replace('"done"', '"完成"').replace('"%d steps"', '"%d 步"').replace('"total: {}"', '"总计：{}"') \
    .replace("The time as shown.", "显示的时间。").replace(' max {', ' 最大 {').replace("['raw']", "['原始']").replace('{"raw"', '{"原始"')
TRANSLATION = TRANSLATION.replace('f"{ms:.1f} ms"', 'f"{ms:.1f} 毫秒"').replace('wo="wo", ni="ni"', 'wo="我", ni="你"')


def run(source: str) -> str:
    K.TABLE.clear()
    K.LITERALS.clear()
    namespace = {}
    # the names install puts in a kernel's namespace
    namespace.update(_tr_text=K.literal, _tr_both=K.both, _tr_format=K.formatted, _tr_call=K.called,
                     _tr_join=K.joined)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(source, namespace)  # noqa: S102 - the test's own code
    return out.getvalue()


def test_one_run_prints_what_each_edition_prints():
    """The rewritten cell prints the English cell's text, and its table turns that into the
    translated cell's text, numbers from the same evaluation (a translated key in an f-string's
    expression reads the run's own dictionary)."""
    english = run(ENGLISH)
    translation = run(TRANSLATION)
    rewritten = run(run_source(ENGLISH, TRANSLATION))
    assert rewritten == english
    assert K.translated_text(rewritten, K.TABLE) == translation


def test_a_value_in_a_translated_f_string_is_computed_once():
    """A timer or a random draw in an f-string the editions word differently: both format the one
    value (computed twice, the pages printed 8.0 s and 8.1 s for one run)."""
    english = 'ticks = iter(range(10))\nprint(f"took {next(ticks)} s, width {3:{next(ticks)}}|")\n'
    translation = english.replace("took", "用时").replace(" s,", " 秒，").replace("width", "宽度")
    rewritten = run(run_source(english, translation))
    assert rewritten == "took 0 s, width 3|\n"
    assert K.translated_text(rewritten, K.TABLE) == "用时 0 秒， 宽度 3|\n"


def test_docstrings_and_identical_code_stay_as_written():
    source = run_source(ENGLISH, TRANSLATION)
    assert '"""The time as shown."""' in source or "'The time as shown.'" in source
    assert run_source("x = 1\n", "x = 1\n") == "x = 1"
    assert run_source("%timeit 1\n", "%timeit 1\n") == "%timeit 1\n", "a cell Python cannot parse runs as it is"


def test_a_cell_differing_in_more_than_strings_runs_as_the_english_one():
    assert run_source('print("a")\n', 'print("甲"); x = 2\n') == "print('a')"


def test_translation_never_replaces_inside_a_word():
    table = {"step": "步", "steps done": "步已完成"}
    assert K.translated_text("3 steps done; stepping", table) == "3 步已完成; stepping"


def _figure():
    import matplotlib
    matplotlib.use("agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.plot([0, 1], label=K.literal("a legend", "图例"))
    ax.legend()
    ax.set_title(K.both("a title", "标题"))
    ax.set_xlabel(K.both("an axis", "横轴"))
    ax.set_xticks([0, 1], [K.both("tick one", "刻度一"), K.both("tick two", "刻度二")])
    ax.annotate(K.both("a note", "注释"), (0.5, 0.5))
    ax.table([[K.both("a table cell", "表格")]], loc="bottom")
    ax.text(9, 9, K.both("outside the axes", "看不见"), visible=False)
    return fig, plt


def test_the_kernel_draws_each_figure_in_both_languages(tmp_path):
    """One figure object, two images: the translated one draws every kind of text translated,
    with the edition's font; the record holds the strings it drew (an invisible one not)."""
    record_file = tmp_path / "record.json"
    K.TABLE.clear()
    uninstall = K.install({}, ["Noto Sans CJK SC"], str(record_file))
    try:
        fig, plt = _figure()
        english = io.BytesIO()
        fig.canvas.print_figure(english, format="png")
        plt.close(fig)
    finally:
        uninstall()
    record = json.loads(record_file.read_text())
    (figure,) = record["figures"].values()
    assert {"图例", "标题", "横轴", "刻度一", "刻度二", "注释", "表格"} <= set(figure["text"])
    assert "看不见" not in figure["text"] and not any(re.search("[a-z]{3}", t) for t in figure["text"])
    assert base64.b64decode(figure["image"]) != english.getvalue()
    assert not record["problems"], record["problems"]
    translator = Translator(record)
    output = {"output_type": "display_data", "metadata": {},
              "data": {"image/png": base64.b64encode(english.getvalue()).decode(), "text/plain": "<Figure>"}}
    translated, drawn = translator.output(output)
    assert translated["data"]["image/png"] == figure["image"] and drawn == figure["text"]


def test_a_glyph_no_font_has_is_a_problem(tmp_path):
    """A figure drawn without the glyphs it needs (matplotlib draws boxes) is recorded, and the
    build fails on it (coursegen.book.run_chapter)."""
    record_file = tmp_path / "record.json"
    uninstall = K.install({}, [], str(record_file))
    try:
        import matplotlib
        matplotlib.use("agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots()
        ax.set_title("\u0f40\u0f41")  # Tibetan: in no font the build uses
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig.canvas.print_figure(io.BytesIO(), format="png")
        plt.close(fig)
    finally:
        uninstall()
    problems = json.loads(record_file.read_text())["problems"]
    assert problems and "missing from font" in problems[0]


def test_a_cell_writing_to_stderr_is_found():
    """The build fails on it (``run_chapter``): no page shows a warning."""
    from coursegen.book import stderr_shown
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x"), nbformat.v4.new_code_cell("y")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="fine\n")]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stderr", text="\nUserWarning: careful\nmore\n")]
    assert stderr_shown(nb) == [(1, "UserWarning: careful")]


def test_the_prelude_loads_the_kernel_side_by_path():
    code = prelude(["Noto Sans CJK SC"], "/tmp/x.json")
    assert "spec_from_file_location" in code and "bilingual_kernel.py" in code and "install(globals()" in code


NUMBER = re.compile(r"(?<![\w.])-?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?")


def _numbers(nb) -> list[list[str]]:
    """Per code cell, the numbers its printed and shown text holds (sorted: a translation may
    put them in another order)."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        text = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                text.append(output["text"])
            elif "text/plain" in output.get("data", {}) and "scrapbook" not in output.get("metadata", {}):
                text.append(output["data"]["text/plain"])
        cells.append(sorted(NUMBER.findall("\n".join(text))))
    return cells


@pytest.mark.parametrize("chapter", [c.name for c in chapters()])
def test_both_editions_show_the_numbers_of_one_run(book, chapter):
    """Every number a translated page prints, and every number its prose glues, is the English
    page's: both come from the chapter's one run (timings included, which differ run to run)."""
    found = next(c for c in chapters() if c.name == chapter)
    english = executed_chapter(found, SOURCE_LANGUAGE)
    numbers = {name: o["data"].get("text/plain") for name, o in glued_outputs(english).items()}
    for language in TRANSLATIONS:
        translation = executed_chapter(found, language)
        glued = {name: o["data"].get("text/plain") for name, o in glued_outputs(translation).items()}
        assert {n: v for n, v in glued.items() if v and v.isascii()} == \
            {n: v for n, v in numbers.items() if v and v.isascii()}, "glued numbers differ between the editions"
        differ = [(i, a, b) for i, (a, b) in enumerate(zip(_numbers(english), _numbers(translation))) if a != b]
        assert not differ, f"{chapter} ({language}): printed numbers differ from the English page's: {differ[:3]}"
        # The page's prose glues from the notebook the page is made of: the staged one holds the run's.
        staged = nbformat.read(stage_of(language) / "chapters" / f"{chapter}.ipynb", as_version=4)
        assert {n: o["data"] for n, o in glued_outputs(staged).items()} == \
            {n: o["data"] for n, o in glued_outputs(translation).items()}
