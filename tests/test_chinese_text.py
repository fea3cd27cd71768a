"""The Chinese edition reads as Chinese: what the generated notebooks show, checked on their own.

* no translation glues two string literals together (a title once came out as
  ``"标题""标题"``: one literal found by two rules and replaced twice);
* no English left where a reader reads it: markdown, comments, docstrings, and every
  string literal that reaches a printed line, a figure or an error message (identifiers,
  units, code, proper names, quoted examples and references are not prose);
* a term is glossed with its English once per chapter, at its first use, after a term
  (not an everyday word), never inside other brackets and never as echoed capitals;
* every chapter's standard headings are the ones of ``coursegen/headings.py``;
* the notes only this edition needs are there, in prose, with no host in running code.
"""
from __future__ import annotations

import ast
import calendar
import io
import re
import tokenize
import unicodedata

import nbformat
import pytest

from support import ROOT
from test_book import book  # noqa: F401 - the built book, for the tests that read its runs

from coursegen import catalogs, headings
from coursegen.edition_notes import NOTES
from coursegen.front_matter import GLOSSED_ONCE_IN_THE_BOOK, glossary
from coursegen.translatable import _NOT_PROSE, TEXT_IN_MATH_PROSE, markdown_blocks, translate_code
from coursekit.conventions import chapter_names, figure_font_setup

LANGUAGE = "zh_CN"
CHAPTERS = chapter_names()
HAN = re.compile(r"[\u4e00-\u9fff]")
ENGLISH_WORD = re.compile(r"(?<![\w.\\/@#-])[A-Za-z][a-z]{2,}(?![\w(/@-])")
# Words that are the field's own vocabulary in Chinese technical writing too, or proper names.
NOT_PROSE = {
    "softmax", "argmax", "logit", "logits", "autograd", "dtype", "bug", "nucleus", "state", "dict",
    "small", "medium", "large", "present", "past", "self", "float", "mask", "tab", "blue", "orange",
    "Transformer", "Transformers", "Attention", "Bahdanau", "Luong", "Hugging", "Face", "Python",
    "PyTorch", "Jupyter", "Linux", "Adam", "Linformer", "Performer", "Reformer", "Longformer",
    "BigBird", "FlashAttention", "Perceiver", "Llama", "Mistral", "Falcon", "Thinking", "Machines",
    "nan", "inf", "tensor", "True", "False", "None", "grad", "requires", "device",  # a tensor's repr
}
# Figure settings written as strings (matplotlib's vocabulary, not text anyone reads).
SETTINGS = re.compile(r"^(?:upper|lower|center)(?: (?:left|right|center))?$|^round,pad=|^tab:\w+$")
TEXT_CALLS = {"print", "set_title", "set_xlabel", "set_ylabel", "suptitle", "set_text", "annotate", "title",
              "xlabel", "ylabel", "text", "legend", "set_xticks", "set_yticks", "set_xticklabels",
              "set_yticklabels", "supxlabel", "supylabel"}


def _notebook(chapter: str, language: str | None = LANGUAGE):
    folder = ROOT / "chapters" / language if language else ROOT / "chapters"
    return nbformat.read(folder / f"{chapter}.ipynb", as_version=4)


def _code(cell) -> str:
    return cell.source.replace(figure_font_setup(LANGUAGE), "")


# --------------------------------------------------------------------------- glued literals

def _adjacent_strings(source: str) -> int:
    """How many times a string literal directly follows another (implicit concatenation)."""
    count, previous = 0, None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            continue
        count += token.type == tokenize.STRING and previous == tokenize.STRING
        previous = token.type
    return count


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_translated_string_literal_is_glued_to_another(chapter):
    """No code cell of the Chinese notebooks has more implicit concatenations than the English one (a
    literal written over several lines may become one: a translation is one unit)."""
    for folder in ("chapters", "source"):
        en_path = ROOT / folder / (f"{chapter}.ipynb" if folder == "chapters" else f"{chapter}/{chapter}.ipynb")
        zh_path = ROOT / folder / LANGUAGE / en_path.relative_to(ROOT / folder)
        english, chinese = (nbformat.read(p, as_version=4) for p in (en_path, zh_path))
        glued = [zh.source[:200] for en, zh in zip(english.cells, chinese.cells) if zh.cell_type == "code"
                 and _adjacent_strings(_code(zh)) > _adjacent_strings(en.source)]
        assert not glued, f"{zh_path.relative_to(ROOT)}: a translation glued literals together:\n" + \
            "\n---\n".join(glued)


def test_a_literal_two_rules_find_is_translated_once():
    """``title=`` inside a figure-text dict is both figure text and a dict value: one unit, one literal."""
    source = 'QKV_TEXT = dict(\n    title="Scaled dot-product self-attention, one sequence",\n    x="X")\n'
    translated = translate_code(source, "code", {"Scaled dot-product self-attention, one sequence": "缩放点积自注意力"}.get)
    assert translated == 'QKV_TEXT = dict(\n    title="缩放点积自注意力",\n    x="X")\n', translated
    assert _adjacent_strings(translated) == 0


# --------------------------------------------------------------------------- English left

def _identifiers(chapter: str) -> set[str]:
    """Names the chapter's code uses, and the one-word strings it keys on (not prose in any language)."""
    names = set()
    for cell in _notebook(chapter, None).cells:
        if cell.cell_type != "code":
            continue
        for token in tokenize.generate_tokens(io.StringIO(cell.source).readline):
            if token.type == tokenize.NAME:
                names.update(token.string.split("_"))
            elif token.type == tokenize.STRING and re.fullmatch(r"[rbuf]*(['\"])\w+\1", token.string, re.I):
                names.update(token.string.strip("rbufRBUF'\"").split("_"))
    return names


def _english_words(text: str, allowed: set[str]) -> list[str]:
    """English words of TEXT that a Chinese reader would have to read as English prose."""
    text = re.sub(r"^(`{3,}|~{3,})[^\n]*\n.*?^\1[ \t]*$", " ", text, flags=re.M | re.S)  # fenced code (a hint's)
    for pattern in _NOT_PROSE:
        text = pattern.sub(" ", text)
    text = re.sub(r"\{[^{}]*\}", " ", text)                        # f-string fields, roles
    text = re.sub(r"“[^”]*”|\*[^*\n]+\*|^>.*$", " ", text, flags=re.M)  # quoted examples, titles
    text = re.sub(r"（[^（）]*）", " ", text)                         # glosses
    if HAN.search(text):  # in Chinese prose a capitalised word is a name (authors, models, places)
        text = "\n".join(line for line in text.split("\n")
                         if not (line.startswith("|") and HAN.search(line)))  # a bilingual table row
        return [w for w in ENGLISH_WORD.findall(text) if w[0].islower() and w not in allowed]
    return [w for w in ENGLISH_WORD.findall(text) if w not in allowed and w.lower() not in allowed]


def _shown_literals(tree: ast.AST) -> list[ast.AST]:
    """String literals a reader sees: printed, drawn, raised, asserted, docstrings, figure-text dicts."""
    found = []
    for node in ast.walk(tree):
        parts = []
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in TEXT_CALLS:
                parts += node.args + [k.value for k in node.keywords if k.arg not in ("loc", "color", "ha", "va")]
            parts += [k.value for k in node.keywords if k.arg in ("label", "title", "xlabel", "ylabel", "titles")]
        elif isinstance(node, ast.Assert) and node.msg is not None:
            parts.append(node.msg)
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            parts += node.exc.args
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and re.search(r"TEXT|text$|^FIG_", t.id)
                                                  for t in node.targets):
            parts.append(node.value)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            parts.append(node.body[0].value)
        for part in parts:
            found += [n for n in ast.walk(part) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return found


def _untranslated(chapter: str) -> list[str]:
    allowed = NOT_PROSE | _identifiers(chapter)
    found = []
    for number, cell in enumerate(_notebook(chapter).cells):
        if cell.cell_type == "markdown":
            if re.search(r"^## 参考文献", cell.source, re.M):
                continue                                      # paper titles stay as published
            for block in markdown_blocks(cell.source):
                words = _english_words(block, allowed)
                if len(words) >= 3:
                    found.append(f"cell {number}, markdown: {words[:6]} in {block[:90]!r}")
            continue
        source = cell.source  # the figure-font setup included: its comment is read too
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and not HAN.search(token.string) \
                    and not re.match(r"#\s*(noqa|type:|pragma)", token.string):
                words = _english_words(token.string[1:], allowed)
                if len(words) >= 2:
                    found.append(f"cell {number}, comment: {token.string[:90]!r}")
        for node in _shown_literals(ast.parse(source)):
            text = node.value
            if HAN.search(text) or SETTINGS.search(text):
                continue
            words = _english_words(text, allowed)
            if len(words) >= 2:
                found.append(f"cell {number}, shown string: {text[:90]!r}")
    return found


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_english_is_left_where_a_chinese_reader_reads(chapter):
    found = _untranslated(chapter)
    assert not found, f"{chapter}: {len(found)} places still in English (a catalog entry to translate, or a " \
                      "string translatable.py does not find yet):\n" + "\n".join(found)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_formulas_say_their_words_in_chinese(chapter):
    """A formula's words (``\\text{for every } pos``) are read too: the catalogs translate the formula."""
    allowed = NOT_PROSE | _identifiers(chapter)
    found = [f"cell {number}: {m.group(0)!r}" for number, cell in enumerate(_notebook(chapter).cells)
             if cell.cell_type == "markdown" for m in TEXT_IN_MATH_PROSE.finditer(cell.source)
             if not re.search(r'\\text\{\s*"', m.group(0))  # a quoted example stays as written
             and [w for w in re.findall(r"[A-Za-z]{3,}", m.group(0)[6:]) if w not in allowed]]
    assert not found, f"{chapter}: English words in formulas:\n" + "\n".join(found)


def test_the_english_check_finds_english(monkeypatch):
    """Not vacuous: the English notebook of Chapter 2 is full of English by this check's measure."""
    monkeypatch.setattr(nbformat, "read", lambda path, as_version: _read_english(path))
    assert len(_untranslated("02_self_attention")) > 50


def _read_english(path):
    return nbformat.v4.reads((ROOT / "chapters" / path.name).read_text())


# --------------------------------------------------------------------------- glosses

GLOSS = re.compile(r"(?P<word>[\u4e00-\u9fff]{1,8}\*?)（(?P<english>[A-Za-z][^（）\u4e00-\u9fff]*)）")
# Everyday words a reader of this course knows in Chinese without their English.
EVERYDAY = {"tensor", "shape", "batch", "matrix", "dimension", "parameter", "training", "loss",
            "broadcasting", "vector", "model", "input", "output", "function", "layer"}


def _prose(domain: str) -> list[str]:
    return [m.string for m in catalogs.read(domain, LANGUAGE) if m.id and m.string and "markdown" in m.auto_comments]


def _broken_bold(text: str) -> list[str]:
    """``**`` runs CommonMark will not read as bold, as excerpts.

    A run opens only when left-flanking and closes only when right-flanking; full-width
    punctuation counts as punctuation, so ``**缓存（cache）**让`` stays literal asterisks
    on the page (the closing run sits between punctuation and a Han character).
    """
    def punct(c):
        return c != "" and unicodedata.category(c)[0] in "PS"

    def space(c):
        return c == "" or c.isspace()
    text = re.sub(r"`[^`]*`|\$[^$]*\$", lambda m: "x" * len(m.group()), text)  # code and math hold no markup
    broken, opening = [], True
    for run in re.finditer(r"\*\*", text):
        before = text[run.start() - 1] if run.start() else ""
        after = text[run.end()] if run.end() < len(text) else ""
        left = not space(after) and (not punct(after) or space(before) or punct(before))
        right = not space(before) and (not punct(before) or space(after) or punct(after))
        if not (left if opening else right):
            broken.append(text[max(0, run.start() - 12):run.end() + 12])
        opening = not opening
    return broken


def test_the_bold_check_finds_what_commonmark_leaves_literal():
    assert _broken_bold("借助**KV 缓存（key/value cache）**让生成变快") == ["value cache）**让生成变快"]
    assert _broken_bold("借助 **KV 缓存**（key/value cache）让生成变快，`a ** b`") == []


@pytest.mark.parametrize("domain", [f"chapters/{c}" for c in CHAPTERS] + [catalogs.FRONT_MATTER])
def test_bold_in_translated_prose_renders_as_bold(domain):
    broken = [excerpt for text in _prose(domain) for excerpt in _broken_bold(text)]
    assert not broken, f"{domain}: `**` that the page shows as asterisks (move the punctuation out of the bold): {broken}"


@pytest.mark.parametrize("domain", [f"chapters/{c}" for c in CHAPTERS] + [catalogs.FRONT_MATTER])
def test_a_term_is_glossed_once_at_its_first_use(domain):
    terms = {english.lower() for english in glossary()}
    problems, seen = [], {}
    for text in _prose(domain):
        glosses = [m for m in GLOSS.finditer(text) if m["english"][0].islower()]  # not names, not acronyms
        if re.match(r"#+ ", text) and glosses and glosses[0].start() < len(text.split("\n", 1)[0]):
            problems.append(f"a heading carries a gloss: {text.splitlines()[0]!r}")
        for match in glosses:
            english = match["english"].strip().lower()
            if english in seen:
                problems.append(f"{english!r} glossed again (first after {seen[english]!r}, now after "
                                f"{match['word']!r})")
            seen[english] = match["word"]
            if english in EVERYDAY and english not in terms:
                problems.append(f"an everyday word glossed: {match.group(0)!r}")
        problems += [f"a gloss inside brackets: {m!r}" for m in re.findall(r"（[^（）]*（[A-Za-z][^（）]*）[^（）]*）", text)]
        if domain.startswith("chapters/") and domain != f"chapters/{CHAPTERS[0]}":
            problems += [f"{m.group(0)!r}: an everyday term, glossed once in the book (Chapter 1)"
                         for m in glosses if m["english"].strip().lower() in GLOSSED_ONCE_IN_THE_BOOK]
    messages = [m for m in catalogs.read(domain, LANGUAGE) if m.id and m.string]
    english_words = {w for m in messages for w in re.findall(r"\b[a-z]{3,}\b", m.id)}
    for text in (m.string for m in messages):  # "（SMALLEST）": an ordinary word in capitals, echoed
        problems += [f"English capitals echoed: {m.group(0)!r}" for m in re.finditer(r"（([A-Z]{3,})\b[^（）]*）", text)
                     if m.group(1).lower() in english_words and m.group(1) not in ("AND", "OR", "NOT", "XOR")]
    assert not problems, f"{domain}:\n" + "\n".join(problems)


def test_glossary_uses_d2l_zh_terms_and_kv_cache():
    terms = glossary()
    assert terms["layer normalization"][0] == "层规范化" and terms["dropout"][0] == "暂退法"
    assert terms["masked softmax"][0] == "掩蔽 softmax" and terms["attention pooling"][0] == "注意力汇聚"
    assert terms["key/value cache"][0] == "KV 缓存"


# --------------------------------------------------------------------------- headings

def _headings(chapter: str, language: str | None) -> list[str]:
    lines = []
    for cell in _notebook(chapter, language).cells:
        if cell.cell_type == "markdown":
            lines += [line for line in cell.source.split("\n") if re.match(r"#{1,4} |\*\*[^*]+\*\*", line)]
    return lines


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_uses_the_standard_headings(chapter):
    """Headings and opening labels come from coursegen/headings.py, the same in every chapter."""
    sections, labels = headings.SECTIONS[LANGUAGE], headings.LABELS[LANGUAGE]
    english, chinese = _headings(chapter, None), _headings(chapter, LANGUAGE)
    problems = []
    for line in english:
        for en, zh in sections.items():
            if re.fullmatch(r"#{2,4} " + re.escape(en), line) and f"{line.split()[0]} {zh}" not in chinese:
                problems.append(f"{line!r} is not {zh!r}")
        for en, zh in labels.items():
            if line.startswith(f"**{en}**") and not any(c.startswith(f"**{zh}**") for c in chinese):
                problems.append(f"{en!r} is not {zh!r}")
        if line.startswith("# Chapter"):
            number = int(line.split()[2].rstrip(":"))
            title = next(c for c in chinese if c.startswith("# "))
            if not title.startswith(f"# 第 {number} 章：") or re.search(r"（[A-Za-z]", title):
                problems.append(f"title {title!r}: '# 第 {number} 章：' and no English gloss")
        if re.match(r"#{2,4} (\d+\. )?Exercise: ", line):
            if not any(re.match(r"#{2,4} (\d+\. )?练习：", c) for c in chinese):
                problems.append(f"{line!r}: its heading is not '练习：...'")
    zh_exercises = sum(bool(re.match(r"#{2,4} (\d+\. )?练习：", c)) for c in chinese)
    en_exercises = sum(bool(re.match(r"#{2,4} (\d+\. )?Exercise: ", c)) for c in english)
    assert not problems and zh_exercises == en_exercises, f"{chapter}:\n" + "\n".join(problems)


def test_the_heading_table_is_what_the_catalogs_check():
    """A chapter's catalog that drifts from the table is listed by `catalogs check` (so by make test)."""
    assert headings.problems("## Summary", "## 总结", LANGUAGE)
    assert headings.standard("## Summary", "## 总结", LANGUAGE) == "## 小结"
    assert headings.standard("**Time.** About 2 hours.", "**时间。** 约 2 小时。", LANGUAGE) == "**用时。** 约 2 小时。"
    assert headings.standard("# Chapter 3: Multi-head attention", "# 第 3 章：多头注意力（multi-head attention）",
                             LANGUAGE) == "# 第 3 章：多头注意力"


# --------------------------------------------------------------------------- edition notes

def test_chapter_7_tells_chinese_readers_how_to_reach_gpt2_and_pypi_through_mirrors():
    nb = _notebook("07_gpt")
    prose = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "HF_ENDPOINT" in prose and "pip install -i" in prose and "镜像" in prose
    # the code names no mirror's host (it may change), but asks for the host transformers will use
    assert not re.search(r"https?://(?!huggingface\.co)[a-z0-9-]+\.[a-z]", code), "a mirror's host belongs in prose"
    assert 'environ.get("HF_ENDPOINT")' in code, "the hub check must honour HF_ENDPOINT, as transformers does"


def test_edition_notes_hold_no_host_name():
    for chapters in NOTES.values():
        for notes in chapters.values():
            for _, note in notes:
                assert not re.search(r"https?://[a-z0-9-]+\.[a-z]", note), "name no mirror host: it may change"


# --------------------------------------------------------------------------- run: what figures and prints show
#
# The book build executes every chapter once with the reference in the stubs, for both editions
# (``coursegen.book.run_chapter``, cached in _build/executed), and records in the Chinese notebook
# every string each shown figure draws (tests/test_bilingual_run.py checks the recording) (titles, axis and tick labels, legends, annotations, table
# cells) as cell metadata; the printed lines are the cached outputs. These tests read that
# cache, after the test run's book build (``test_book.book``).

# Words a Chinese page may show in English, beyond NOT_PROSE: each kind for the reason given.
SHOWN_ENGLISH = {
    # units and notation, written so in Chinese technical text too
    "MiB", "KiB", "GiB", "nats", "Var", "log", "alpha",
    # code in figures and printed lines, where code spans cannot mark it: PyTorch's tensor
    # methods, GPT-2's module names (Hugging Face's state_dict keys), the Python package
    "view", "transpose", "reshape", "idx", "attn", "mlp", "wte", "wpe", "transformers",
    # the sampling filters' names, written so in Chinese too (top-k, top-p)
    "top",
    # names of a model family and of a company (Qwen3, as the checkpoints spell it; Meta's Llama code)
    "Qwen", "Meta",
    # notation in printed comparisons: max |a - b|, mean |x|
    "max", "mean",
    # Chapter 1's data: the dates the model reads are English (its input alphabet), not text
    *calendar.month_name[1:], *calendar.month_abbr[1:], *calendar.day_name, *calendar.day_abbr,
}


# Cells that print a chapter's data: the corpus of Chapters 7 and 8 (Python's own docstrings)
# and the text their models write from it. Their lines without a Chinese character are that
# data, not text.
DATA_PRINTS = dict.fromkeys(("07_gpt", "08_modern_attention"),
                            re.compile(r"\bsample_text\(|\bdecode\(|\bprint\(corpus\["))


def _data_words(chapter: str) -> set[str]:
    """The English a chapter's model reads as its input: Chapter 5's toy translation goes from English
    sentences (the English side of its SUBJECTS ... TIMES tables, verbs with their -s too) to Chinese."""
    tables = ("SUBJECTS", "VERBS", "ADJECTIVES", "OBJECTS", "PLACES", "TIMES")
    words = set()
    for node in ast.walk(ast.parse((ROOT / "course" / f"{chapter}.py").read_text())):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in tables for t in node.targets):
            for row in node.value.elts:
                if isinstance(row.elts[0], ast.Constant) and row.elts[0].value:
                    words.update(w for word in row.elts[0].value.split() for w in (word, word + "s"))
    return words


def _executed(chapter: str) -> nbformat.NotebookNode:
    from coursegen import chapters
    from coursegen.book import executed_chapter
    return executed_chapter(next(c for c in chapters() if c.name == chapter), LANGUAGE)


def _quoted_examples(chapter: str) -> set[str]:
    """English words the chapter's Chinese prose quotes as examples (“animal”, “tired”): an
    example sentence's tokens stay English in its figures, as the prose quotes them."""
    prose = "\n".join(c.source for c in _notebook(chapter).cells if c.cell_type == "markdown")
    return {w for quoted in re.findall(r"“([^”]*)”|^> (.*)$", prose, re.M)
            for part in quoted for w in re.findall(r"[A-Za-z]+", part)}


def shown_at_run(nb: nbformat.NotebookNode) -> list[tuple[int, str, str]]:
    """(cell, kind, text): every figure string, printed line and glued string of an executed notebook."""
    from coursegen.book import FIGURE_TEXT
    shown = []
    for number, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        shown += [(number, "figure", text) for figure in cell.metadata.get(FIGURE_TEXT, []) for text in figure]
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                shown += [(number, f"printed ({output['name']})", line) for line in output["text"].splitlines()]
            elif "scrapbook" in output.get("metadata", {}):
                value = output.get("data", {}).get("text/plain", "")
                if re.match(r"^['\"]", value):  # a glued string, not a number
                    shown.append((number, "glued", value.strip("'\"")))
            elif "text/plain" in output.get("data", {}) and not {"image/png", "text/html"} & set(output["data"]):
                shown += [(number, "shown value", line) for line in output["data"]["text/plain"].splitlines()]
    return shown


# Code and names: an exception as Python prints it, identifiers (d_model, torch.Size), calls and
# their keyword arguments (window=5),
# CamelCase names (GRUCell, PyTorch) and acronyms (GPU, FLOPs).
# A shape (B, N_tgt, vocab) and a special token <bos> are code as well.
CODE_TOKEN = re.compile(r"\([\w ]+(?:, *[\w ]+)+\)|<\w+>|\w*\[[^\]\n]*\]|\b\w+(?:Error|Exception)\(.*\)|\w*[_.]\w[\w.]*|\w+\(|\b\w+=(?!=)|\b[A-Za-z]+[A-Z][A-Za-z]*\b")
SHOWN_WORD = re.compile(r"(?<![A-Za-z])[A-Za-z]{3,}(?![A-Za-z])")


def english_shown(shown, allowed: set[str]) -> list[str]:
    """The shown strings holding an English word: every word of three letters or more (hyphenated
    ones too), in a line of Chinese too, outside math, code spans, identifiers (a word joined by
    ``_`` or ``.``, or called) and acronyms."""
    found = []
    for number, kind, text in shown:
        bare = text
        for pattern in _NOT_PROSE:
            bare = pattern.sub(" ", bare)
        bare = CODE_TOKEN.sub(" ", bare)
        words = [w for w in SHOWN_WORD.findall(bare) if w not in allowed and w.lower() not in allowed]
        if words:
            found.append(f"cell {number}, {kind}: {text[:100]!r} ({', '.join(words[:5])})")
    return found


def test_the_english_check_of_what_a_run_shows_finds_english():
    shown = [(1, "figure", "训练损失"), (1, "figure", "train loss"), (2, "printed (stdout)", "头 0：pronoun -> 形容词"),
             (3, "figure", "$\\sqrt{d_k}$ = 8"), (3, "printed (stdout)", "W_q.weight 形状 torch.Size([8, 8])"),
             (4, "glued", "post-LN, warm-up"), (5, "figure", "softmax 权重")]
    assert [line.split(",")[0] for line in english_shown(shown, NOT_PROSE)] == ["cell 1", "cell 2", "cell 4"]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_what_the_chinese_chapter_draws_and_prints_is_chinese(book, chapter):
    """Every figure string, printed line and glued string of the book's run of the Chinese chapter."""
    from coursegen.book import FIGURE_TEXT
    nb = _executed(chapter)
    assert nb.metadata.get(FIGURE_TEXT), "the cached run has no figure-text record: the book build did not record it"
    shown = shown_at_run(nb)
    kinds = {kind for _, kind, _ in shown}
    assert "figure" in kinds and "printed (stdout)" in kinds, f"the run drew or printed nothing: {kinds}"
    data = DATA_PRINTS.get(chapter)
    shown = [(number, kind, text) for number, kind, text in shown
             if not (data and kind.startswith("printed") and not HAN.search(text) and data.search(nb.cells[number].source))]
    english = english_shown(shown, NOT_PROSE | SHOWN_ENGLISH | _quoted_examples(chapter) | _data_words(chapter))
    assert not english, f"{chapter}: {len(english)} English strings in what the Chinese chapter shows:\n" + \
        "\n".join(english)


MASK_WORDING = {"允许关注": "可以关注", "允许的": "可以关注的", "不可关注": "不能关注", "屏蔽": "掩蔽", "遮蔽": "掩蔽",
                "被掩码": "被掩蔽"}


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_mask_polarity_has_one_wording(chapter):
    """True means 可以关注 (may attend), False 不能关注; a masked score is 被掩蔽: one wording in every chapter."""
    texts = [m.string for m in catalogs.read(f"chapters/{chapter}", LANGUAGE) if m.id and m.string]
    found = [f"{variant!r} (say {say!r}): {t[max(0, t.find(variant) - 20):t.find(variant) + 20]!r}"
             for t in texts for variant, say in MASK_WORDING.items() if variant in t]
    assert not found, f"{chapter}:\n" + "\n".join(found)
