"""Feedback messages that can be told in the submission's language.

The grader writes its messages in English. Two kinds of text carry what a translation needs:

* ``msg(template, **fields)``: a message of the grader's own, e.g.
  ``msg("`{target}` raised {error}{where}", ...)``. It is the English string, and keeps its
  template and fields, so the Chinese template is filled with the same fields (each field
  told in turn if it is itself a message or a hidden test's text).
* ``from_tests(text)``: text written in a chapter's hidden tests (a mistake's name, a probe's
  label, a check's hint, a memory rule). Its catalog entry is the literal as written there;
  an f-string's entry keeps its ``{fields}``, which are read back from the finished text.

Anything else (a function's name, the error a submission raised) is never translated.
The grading JSON stays English; the text report and the feedback page are told in the
submission's language. The catalog is ``locales/<lang>/LC_MESSAGES/feedback.po``; its entries
are extracted by ``coursegen.feedback_texts`` (which reads this package's source, never imports it).
"""
from __future__ import annotations

import functools
import re

from coursekit.conventions import LOCALES_DIR, SOURCE_LANGUAGE

_FIELD = re.compile(r"\{\{|\}\}|\{[^{}]*\}")


class Message(str):
    """English text that remembers the template and fields it was made from."""

    template: str
    fields: dict

    def __new__(cls, template: str, **fields):
        self = super().__new__(cls, template.format(**fields))
        self.template, self.fields = template, fields
        return self

    def __reduce__(self):  # pickled with what makes it translatable (class runs use processes)
        return _message, (self.template, self.fields)

    def but(self, **fields) -> Message:
        """The same message with FIELDS told otherwise (its template kept): a verdict without its case."""
        return Message(self.template, **{**self.fields, **fields})


def _message(template, fields):
    return Message(template, **fields)


class TestText(str):
    """Text written in a chapter's hidden tests, looked up in the catalog as written there."""

    def __reduce__(self):
        return TestText, (str(self),)


def msg(template: str, **fields) -> Message:
    return Message(template, **fields)


def from_tests(text) -> TestText | str:
    return TestText(text) if isinstance(text, str) and not isinstance(text, Message) else text


# ------------------------------------------------------------------ telling

@functools.lru_cache(maxsize=None)
def _catalog(language: str) -> tuple[dict, list]:
    """(msgid -> msgstr, [(pattern, fields, msgstr)] for entries with braces) of LANGUAGE."""
    from babel.messages.pofile import read_po
    path = LOCALES_DIR / language / "LC_MESSAGES" / "feedback.po"
    if not path.exists():
        return {}, []
    with path.open("rb") as f:
        finished = [m for m in read_po(f, locale=language) if m.id and m.string and not m.fuzzy]
    entries = {m.id: m.string for m in finished}
    # Only hidden tests' f-strings are read back from finished text (the grader's own messages
    # keep their template); the most specific first, so "n={n}, radius={r}" cannot take
    # "n=12, radius=2, causal".
    from_hidden_tests = [m for m in finished if "{" in m.id and any(p.startswith("course/") for p, _ in m.locations)]
    from_hidden_tests.sort(key=lambda m: -len(_FIELD.sub("", m.id)))
    return entries, [(*_pattern(m.id), m.string) for m in from_hidden_tests]


def _pattern(template: str) -> tuple[re.Pattern, list[str]]:
    """A regex that reads an f-string template's fields back from its finished text."""
    regex, fields, at = "", [], 0
    for found in _FIELD.finditer(template):
        regex += re.escape(template[at:found.start()])
        token = found.group(0)
        if token in ("{{", "}}"):
            regex += re.escape(token[0])
        else:
            regex += "(.+?)"
            fields.append(token)
        at = found.end()
    return re.compile(regex + re.escape(template[at:]), re.S), fields


def tell(text, language: str) -> str:
    """TEXT in LANGUAGE, as far as the catalog has it (English otherwise)."""
    if language == SOURCE_LANGUAGE or not isinstance(text, str):
        return str(text)
    entries, patterns = _catalog(language)
    if isinstance(text, Message):
        template = entries.get(text.template, text.template)
        try:
            return template.format(**{k: tell(v, language) for k, v in text.fields.items()})
        except (KeyError, IndexError, ValueError):
            return str(text)
    if not isinstance(text, TestText):
        return str(text)
    if text in entries and "{" not in text:
        return entries[text]
    for pattern, fields, told in patterns:
        found = pattern.fullmatch(text)
        if found:
            values = dict(zip(fields, found.groups()))
            return _FIELD.sub(lambda m: values.get(m.group(0), m.group(0)[0]), told)
    return str(text)
