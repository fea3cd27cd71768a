"""The Chinese edition: complete catalogs, the glossary's terms, notebooks that grade like the English ones.

(The Chinese book's pages are checked in ``test_book``, with the English ones.)
"""
from __future__ import annotations

import ast
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from support import ROOT, grade_notebooks, submission
from contract import check_contract

from autograder.chapters import ChapterInfo
from coursegen import catalogs
from coursegen.front_matter import GLOSSED_ONCE_IN_THE_BOOK, glossary
from coursekit.conventions import chapter_names, figure_font_setup, with_python_bin_on_path

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build

LANGUAGE = "zh_CN"
CHAPTERS = chapter_names()
HAN = re.compile(r"[\u4e00-\u9fff]")


# --------------------------------------------------------------------------- catalogs

@pytest.mark.parametrize("domain", catalogs.domains())
def test_every_catalog_entry_is_translated(domain):
    """An English edit that is not translated (missing, empty, fuzzy or with broken markup) fails here."""
    problems = catalogs.problems(domain, LANGUAGE)
    assert not problems, f"{len(problems)} entries to translate (`python -m coursegen.catalogs todo " \
                         f"{domain}`):\n" + "\n".join(problems)


def test_the_completeness_check_catches_an_untranslated_entry(tmp_path, monkeypatch):
    """The check above is not vacuous: blank one entry and mark another fuzzy, and both are listed."""
    domain = "chapters/02_self_attention"
    catalog = catalogs.read(domain, LANGUAGE)
    entries = [m for m in catalog if m.id]
    entries[0].string = ""
    entries[1].flags.add("fuzzy")
    monkeypatch.setattr(catalogs, "LOCALES_DIR", tmp_path)
    catalogs.write(catalog, domain, LANGUAGE)
    found = catalogs.problems(domain, LANGUAGE)
    assert len(found) == 2 and "untranslated" in found[0] and "fuzzy" in found[1], found


def test_catalogs_live_where_sphinx_intl_puts_them():
    for domain in catalogs.domains():
        path = ROOT / "locales" / LANGUAGE / "LC_MESSAGES" / f"{domain}.po"
        assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
        assert '"Language: zh_CN\\n"' in path.read_text(), f"{path.name} does not say its language"


# --------------------------------------------------------------------------- terms

def _markdown_translations(domain: str) -> str:
    catalog = catalogs.read(domain, LANGUAGE)
    return "\n".join(m.string for m in catalog if m.id and "markdown" in m.auto_comments)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapters_use_the_glossarys_terms(chapter):
    """No variant the glossary rules out; each glossary term used is introduced with its English (the
    everyday terms of GLOSSED_ONCE_IN_THE_BOOK in the first chapter only)."""
    domain = f"chapters/{chapter}"
    catalog = [m for m in catalogs.read(domain, LANGUAGE) if m.id]
    every = "\n".join(m.string for m in catalog)
    source = "\n".join(m.id for m in catalog if "markdown" in m.auto_comments)
    prose = _markdown_translations(domain)
    problems = []
    for english, (chinese, avoid) in glossary().items():
        problems += [f"{variant!r} instead of {chinese!r} ({english})" for variant in avoid if variant in every]
        # A term the chapter uses: its English is in the English prose and its Chinese in the
        # translation (one-character terms such as 头 are too common to search for).
        uses = re.search(r"\b" + re.escape(english), source, re.I) and chinese in prose
        if not uses or len(chinese) < 2 or not HAN.search(chinese):
            continue
        if english in GLOSSED_ONCE_IN_THE_BOOK and chapter != CHAPTERS[0]:
            continue
        introduced = re.search(r"[（(][^）)]*" + re.escape(english.split()[0]), prose, re.I)
        if not introduced:
            problems.append(f"{chinese!r} is never followed by its English ({english}) in parentheses")
    assert not problems, f"{chapter}:\n" + "\n".join(problems)


def test_the_glossary_page_lists_every_term():
    page = (ROOT / "glossary.md").read_text()
    assert "locales/glossary.csv" in page, "the glossary page does not show the glossary's one source"
    with open(ROOT / "locales" / "glossary.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert len(rows) >= 40 and all(HAN.search(zh) or zh == en for en, zh, _ in rows)
    for term in ("查询", "键", "值", "注意力权重", "多头注意力", "位置编码", "掩码", "KV 缓存",
                 "层规范化", "暂退法", "掩蔽 softmax", "注意力汇聚"):  # d2l-zh's terms
        assert term in {zh for _, zh, _ in rows}, f"the glossary lacks {term}"


def test_the_chinese_glossary_page_has_chinese_column_headers_and_every_row():
    from coursegen.front_matter import translated_page
    page = translated_page("glossary.md", catalogs.translations(catalogs.FRONT_MATTER, LANGUAGE).get)
    assert ":header-rows: 1" in page and ":header:" not in page  # MyST's options cannot hold a quoted list
    with open(ROOT / "locales" / "glossary.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    body = page.split("```{csv-table}", 1)[1].split("```", 1)[0]
    header, *table = csv.reader(line for line in body.strip().splitlines() if line and not line.startswith(":"))
    assert len(header) == 3 and not any(re.search(r"[A-Za-z]{2,}", h) for h in header), \
        f"the Chinese glossary's column headers: {header!r}"
    assert table == rows, "the Chinese glossary page does not show the glossary's rows as they are"


def test_the_chinese_pages_footer_names_the_authors_in_chinese():
    import yaml

    from coursegen.book import edition_config
    config = yaml.safe_load(edition_config(LANGUAGE, catalogs.translations(catalogs.FRONT_MATTER, LANGUAGE).get))
    assert HAN.search(config["author"]) and not re.search(r"[A-Za-z]{3,}", config["author"]), config["author"]


# --------------------------------------------------------------------------- notebooks

@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chinese_learner_notebook_matches_the_english_one(chapter):
    """Same cells, grade ids, points and code; the prose and messages are Chinese."""
    english = nbformat.read(ROOT / "chapters" / f"{chapter}.ipynb", as_version=4)
    chinese = nbformat.read(ROOT / "chapters" / LANGUAGE / f"{chapter}.ipynb", as_version=4)
    assert chinese.metadata["course"]["language"] == LANGUAGE
    assert len(chinese.cells) == len(english.cells)
    for en, zh in zip(english.cells, chinese.cells):
        meta = [{k: v for k, v in c.metadata.get("nbgrader", {}).items() if k != "checksum"} for c in (en, zh)]
        assert en.cell_type == zh.cell_type and meta[0] == meta[1]
        if zh.cell_type == "code":
            assert zh.outputs == [] and zh.execution_count is None
            code = zh.source.replace(figure_font_setup(LANGUAGE), "")
            assert _code_without_text(code) == _code_without_text(en.source), \
                f"{chapter}: the translation changed code, not only text:\n{zh.source[:300]}"
    setups = [c for c in chinese.cells if figure_font_setup(LANGUAGE) in c.source]
    assert len(setups) == 1 and "import matplotlib.pyplot as plt" in setups[0].source, \
        f"{chapter}: the cell importing pyplot must pick a Chinese figure font, once"
    markdown = [c.source for c in chinese.cells if c.cell_type == "markdown"]
    assert sum(bool(HAN.search(m)) for m in markdown) >= 0.9 * len(markdown), "markdown cells left in English"


class _Blank(ast.NodeTransformer):
    def visit_Constant(self, node):
        return ast.Constant("") if isinstance(node.value, str) else node

    def visit_JoinedStr(self, node):
        return ast.Constant("")


def _code_without_text(source: str) -> str:
    """The code's syntax tree with every string emptied (comments are not in it)."""
    return ast.dump(_Blank().visit(ast.parse(source)))


def test_shared_contract_checker_on_the_chinese_notebooks(tmp_path):
    """As ``test_generated.test_shared_contract_checker``: every exercise conforms; the checker's one
    complaint is each written answer (a markdown answer cell graded by hand, no exercise of the spec)."""
    from coursekit import conventions as C
    _, output, _ = check_contract(ROOT / "chapters" / LANGUAGE, tmp_path)
    written = {(f"{chapter}.ipynb", grade_id) for chapter in CHAPTERS for grade_id in
               C.written_points(nbformat.read(ROOT / "chapters" / LANGUAGE / f"{chapter}.ipynb", as_version=4))}
    problems = [line for line in output.splitlines() if line.endswith(" is not in the spec")]
    assert {(line.split(":")[0], line.split("'")[1]) for line in problems} == written, output
    assert f"{len(CHAPTERS)} chapter(s) present, {len(written)} problem(s)" in output, output


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chinese_stubs_fail_their_visible_tests_with_chinese_messages(chapter):
    nb = nbformat.read(ROOT / "chapters" / LANGUAGE / f"{chapter}.ipynb", as_version=4)
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    messages = [m for c in tests for m in re.findall(r"assert [^\n]*?,\s*f?[\"']([^\"']+)", c.source)]
    assert messages and sum(bool(HAN.search(m)) for m in messages) >= 0.8 * len(messages), \
        f"{chapter}: visible tests' messages are not Chinese: {messages[:3]}"


# --------------------------------------------------------------------------- grading

CHAPTER = "02_self_attention"
UNSCALED = '''
def scaled_dot_product_attention(query, key, value, mask=None):
    scores = query @ key.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights
'''


def _told(english: str) -> str:
    from autograder.messages import from_tests, tell
    told = tell(from_tests(english), LANGUAGE)
    assert told != english and HAN.search(told), f"the feedback catalog has no Chinese for {english!r}"
    return told


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    notebooks = {
        "zh-reference": submission(chapter=CHAPTER, language=LANGUAGE),
        "zh-unscaled": submission({"scaled_dot_product_attention": UNSCALED}, chapter=CHAPTER, language=LANGUAGE),
        "en-unscaled": submission({"scaled_dot_product_attention": UNSCALED}, chapter=CHAPTER),
    }
    return grade_notebooks(notebooks, tmp_path_factory.mktemp("zh"))


def test_chinese_reference_gets_full_marks(graded):
    result = graded["zh-reference"]
    assert "error" not in result, result
    assert result["score"] == result["max_score"] > 0, json.dumps(result, ensure_ascii=False)[:2000]


def test_chinese_and_english_mistakes_lose_the_same_points(graded):
    zh, en = graded["zh-unscaled"], graded["en-unscaled"]
    assert zh["score"] == en["score"] < zh["max_score"]
    assert zh == en, "the grading JSON must not depend on the notebook's language"


def test_chinese_submission_gets_a_chinese_report_and_feedback_page(tmp_path):
    from autograder.grading import grade
    path = tmp_path / f"{CHAPTER}.ipynb"
    nbformat.write(submission({"scaled_dot_product_attention": UNSCALED}, chapter=CHAPTER, language=LANGUAGE), path)
    report = grade(path, student="li", feedback=True)
    mistake = _told("scores not scaled by 1/sqrt(d_k)")
    text = report.as_text()
    assert mistake in text and "分" in text.splitlines()[0], text[:1500]
    assert "scores not scaled" not in text, "the Chinese report shows the English message"
    page = report.feedback_page
    assert mistake in page and "得分" in page, "the feedback page is not in Chinese"
    assert "BEGIN HIDDEN" not in page and "attn_probe" not in page


def test_a_class_with_both_editions_grades_in_one_run(tmp_path):
    """Students hand in English and Chinese notebooks; one grade-class run gets each right: the
    same mistake costs the same in both editions, and each is told of it in its notebook's
    language. (Full marks in Chinese: ``test_chinese_reference_gets_full_marks``.)"""
    def cli(*args):
        proc = subprocess.run([sys.executable, "-m", "autograder", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=1200, env=with_python_bin_on_path())
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc
    handed_in = tmp_path / "handed-in"
    students = {
        "wang": submission({"scaled_dot_product_attention": UNSCALED}, chapter=CHAPTER, language=LANGUAGE),
        "ben": submission({"scaled_dot_product_attention": UNSCALED}, chapter=CHAPTER),
    }
    for student, nb in students.items():
        (handed_in / student / CHAPTER).mkdir(parents=True)
        nbformat.write(nb, handed_in / student / CHAPTER / f"{CHAPTER}.ipynb")
    course = tmp_path / "course"
    cli("release", "--course", str(course), CHAPTER)
    cli("collect", str(handed_in), "--course", str(course))
    cli("grade-class", "--course", str(course), "--workers", "2")
    with open(course / "class-grades.csv") as f:
        totals = {row["student"]: float(row["total"]) for row in csv.DictReader(f)}
    assert totals["wang"] == totals["ben"] and 0 < totals["ben"] < sum(ChapterInfo(CHAPTER).tests.values()), totals
    mistake = _told("scores not scaled by 1/sqrt(d_k)")
    pages = {s: (course / "feedback" / s / CHAPTER / f"{CHAPTER}.html").read_text() for s in students}
    assert mistake in pages["wang"] and "scores not scaled by 1/sqrt(d_k)" in pages["ben"]
    assert mistake not in pages["ben"]
