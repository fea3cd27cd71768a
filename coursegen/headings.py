"""The standard headings every chapter shares, and their one translation per language.

A chapter's title (``# Chapter N: ...``), its opening labels (**Learning goals.**,
**Prerequisites.**, ...), its exercise headings and its closing sections are written the
same way in every chapter. Their translations live here, not in each chapter's catalog:
``catalogs update`` writes them into every entry that starts with one, and ``catalogs
check`` (so ``make test``) lists an entry whose heading differs. A title carries no
English gloss (the sidebar shows it); the chapter's prose glosses a term at its first use.
"""
from __future__ import annotations

import re

# English label -> its translation, per language. Bold labels open a paragraph
# (``**Time.** About 2 hours``); section headings are a whole line (``## Summary``).
LABELS = {
    "zh_CN": {
        "Learning goals.": "学习目标。",
        "Prerequisites.": "预备知识。",
        "Time.": "用时。",
        "What you will build.": "你将实现的内容。",
    },
}
SECTIONS = {
    "zh_CN": {
        "Check your understanding": "检验你的理解",
        "Challenges (optional, not graded)": "挑战（选做，不计分）",
        "Summary": "小结",
        "What's next": "下一步",
        "References": "参考文献",
    },
}
# Prefixes: "Chapter 3: ..." and "Exercise: ..." (the rest of the heading is translated as prose).
PREFIXES = {
    "zh_CN": {
        r"^# Chapter (\d+): ": r"# 第 \1 章：",
        r"^(#{2,4} (?:\d+\. )?)Exercise: ": r"\1练习：",
    },
}
_GLOSS = re.compile(r"（[A-Za-z][^（）\u4e00-\u9fff]*）")


def standard(msgid: str, msgstr: str, language: str) -> str:
    """MSGSTR with its standard heading (if MSGID starts with one) as the table says."""
    first, _, rest = msgstr.partition("\n")
    english_first = msgid.split("\n", 1)[0]
    for english, translated in LABELS.get(language, {}).items():
        if msgid.startswith(f"**{english}**"):
            return re.sub(r"^\*\*[^*]*\*\*", lambda _: f"**{translated}**", msgstr, count=1)
    for english, translated in SECTIONS.get(language, {}).items():
        if re.fullmatch(r"#{2,4} " + re.escape(english), english_first):
            hashes = english_first.split(" ", 1)[0]
            return f"{hashes} {translated}" + ("\n" + rest if rest or "\n" in msgstr else "")
    for pattern, replacement in PREFIXES.get(language, {}).items():
        match = re.match(pattern, english_first)
        if match:
            heading = re.sub(r"^#{1,4} (?:\d+\. )?(?:第 \d+ 章|练习)?[：:]\s*", "", first)
            heading = re.sub(r"^#{1,4} (?:\d+\. )?", "", heading)
            if english_first.startswith("# "):
                heading = _GLOSS.sub("", heading)
            new_first = match.expand(replacement) + heading
            return new_first + ("\n" + rest if "\n" in msgstr else "")
    return msgstr


def problems(msgid: str, msgstr: str, language: str) -> str | None:
    """Why MSGSTR's heading is not the standard one, or None."""
    want = standard(msgid, msgstr, language)
    if want != msgstr:
        return f"standard heading {want.splitlines()[0][:40]!r} (coursegen/headings.py), not " \
               f"{msgstr.splitlines()[0][:40]!r}"
    return None
