"""Inside the book's kernel: one run of a chapter that prints and draws for both editions.

Loaded by file path into the kernel that executes a chapter for the book (``bilingual_run``
rewrites the chapter's code so that every string the two editions write differently reaches
``both`` or ``formatted``). Standard library and matplotlib only: the kernel has not imported
this repository's packages.

* A string the editions write differently is a ``Bilingual``: a ``str`` whose value is the
  English text (so the run computes exactly what the English edition computes) and which carries
  the translation. Formatting one into an f-string, adding, ``%``, ``.format``, ``.join`` and
  padding keep both; every pair made is recorded in ``TABLE`` (English text -> translation),
  which the build uses to translate the run's printed text (``bilingual_run.translated``).
* Each figure the kernel renders is drawn twice from the same figure object: as the run draws
  it, and with every text translated and the edition's font first. The second image is kept by
  the first one's hash, with the strings each drew.
* A warning that a glyph is missing from every font (matplotlib then draws boxes), or that a
  font family was not found, is recorded as a problem: the build fails on it.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import re
import warnings
from contextlib import contextmanager

TABLE: dict[str, str] = {}  # every pair the run made
LITERALS: dict[str, str] = {}  # the pairs written in the code: few, so searching them in a text is cheap
_state = {"file": None, "fonts": [], "figures": {}, "problems": [], "translating": False, "drawn": None}


class Bilingual(str):
    """An English string (its value) with its translation (``translated``)."""

    def __repr__(self):
        return str.__repr__(self)

    def __str__(self):  # str(x) keeps both (a helper that starts with text = str(text))
        return self


def english(value):
    return str.__str__(value) if isinstance(value, Bilingual) else value


def translation(value):
    """VALUE's translated view: a plain string the run has a translation of is that translation."""
    if isinstance(value, Bilingual):
        return value.translated
    return TABLE.get(value, value) if isinstance(value, str) else value


def _translated_whole(value):
    """As ``translation``, and a plain string made of translated pieces (a ``" ".join`` of them)
    translated piecewise, by the code's own pairs (searching every pair made would make a run
    that builds many strings quadratic)."""
    if isinstance(value, str) and not isinstance(value, Bilingual) and value not in TABLE:
        return translated_text(value, LITERALS)
    return translation(value)


def _pair(en: str, tr: str):
    if en == tr:
        return en
    TABLE[en] = tr
    made = Bilingual(en)
    made.translated = tr
    return made


def both(en, tr):
    """A string the two editions compute differently (an f-string): the English one's value is used."""
    return _pair(english(en), translation(tr))


def literal(en: str, tr: str):
    """A string literal the two editions write differently."""
    LITERALS[en] = tr
    return _pair(en, tr)


_CONVERT = {-1: lambda v: v, 115: str, 114: repr, 97: ascii}


def formatted(*parts):
    """An f-string: literal parts as they are, each ``(value, conversion, spec)`` formatted in
    each language's view of the value."""
    en, tr = [], []
    for part in parts:
        if isinstance(part, tuple):
            value, conversion, spec = part
            convert = _CONVERT[conversion]
            en.append(format(convert(english(value)), english(spec)))
            tr.append(format(convert(_translated_whole(value)), english(spec)))
        else:
            en.append(part)
            tr.append(part)
    return _pair("".join(en), "".join(tr))


def _both_ways(name):
    method = getattr(str, name)

    def call(self, *args, **kwargs):
        if name == "join":
            items = list(args[0])
            return _pair(method(english(self), [english(i) for i in items]),
                         method(translation(self), [_translated_whole(i) for i in items]))
        if name == "__mod__":
            values = args[0]
            if isinstance(values, tuple):
                en_values, tr_values = tuple(map(english, values)), tuple(map(translation, values))
            elif isinstance(values, dict):
                en_values = {k: english(v) for k, v in values.items()}
                tr_values = {k: translation(v) for k, v in values.items()}
            else:
                en_values, tr_values = english(values), translation(values)
            return _pair(method(english(self), en_values), method(translation(self), tr_values))
        en = method(english(self), *map(english, args), **{k: english(v) for k, v in kwargs.items()})
        tr = method(translation(self), *map(translation, args), **{k: translation(v) for k, v in kwargs.items()})
        return _pair(en, tr) if isinstance(en, str) else en
    call.__name__ = name
    return call


for _name in ("format", "join", "__mod__", "ljust", "rjust", "center", "strip", "lstrip", "rstrip",
              "upper", "lower", "capitalize", "title", "replace"):
    setattr(Bilingual, _name, _both_ways(_name))


def _add(self, other):
    if not isinstance(other, str):
        return NotImplemented
    return _pair(english(self) + english(other), translation(self) + _translated_whole(other))


def _radd(self, other):
    if not isinstance(other, str):
        return NotImplemented
    return _pair(english(other) + english(self), _translated_whole(other) + translation(self))


def joined(separator, items):
    """``separator.join(items)`` (any join in the code): with a string in both languages among the
    items, both languages' joins (``" ".join`` of translated words keeps its translation)."""
    if not isinstance(separator, str):
        return separator.join(items)
    items = list(items)
    if not isinstance(separator, Bilingual) and not any(isinstance(i, Bilingual) for i in items):
        return str.join(separator, items)
    return _pair(str.join(english(separator), [english(i) for i in items]),
                 str.join(translation(separator), [_translated_whole(i) for i in items]))


def called(function, *args, **kwargs):
    """A call in an f-string's value (``pad_to(name, 13)``): with a string in both languages among
    its arguments, the function runs on each language's view (such helpers are pure formatting)."""
    if not any(isinstance(a, Bilingual) for a in (*args, *kwargs.values())):
        return function(*args, **kwargs)
    en = function(*map(english, args), **{k: english(v) for k, v in kwargs.items()})
    if not isinstance(en, str):
        return en
    return _pair(en, function(*map(translation, args), **{k: translation(v) for k, v in kwargs.items()}))


Bilingual.__add__, Bilingual.__radd__ = _add, _radd


def translated_text(text: str, table: dict[str, str]) -> str:
    """TEXT in the translation: TABLE's pair for the whole text, else each English text of TABLE
    within it replaced (longest first, never inside a word)."""
    if text in table:
        return table[text]
    found = sorted((k for k in table if len(k) > 1 and k in text), key=len, reverse=True)
    if not found:
        return text
    pattern = "|".join((r"(?<!\w)" if re.match(r"\w", k[0]) else "") + re.escape(k) +
                       (r"(?!\w)" if re.match(r"\w", k[-1]) else "") for k in found)
    return re.sub(pattern, lambda m: table[m.group(0)], text)


@contextmanager
def _translated(artist):
    """The text artist with its text translated and the edition's fonts first, for one call."""
    if getattr(artist, "_bilingual_swapped", False):
        yield
        return
    text, font = artist._text, artist._fontproperties
    artist._text = translated_text(text, TABLE)
    swapped = font.copy()
    swapped.set_family([*_state["fonts"], *font.get_family()])
    artist._fontproperties = swapped
    artist._bilingual_swapped = True
    try:
        yield
    finally:
        artist._text, artist._fontproperties = text, font
        artist._bilingual_swapped = False


def _record_problem(message: str) -> None:
    if ("missing from font" in message or "not found" in message) and message not in _state["problems"]:
        _state["problems"].append(message)


class _FontLog(logging.Handler):
    def emit(self, record):
        _record_problem(record.getMessage())


def _dump():
    with open(_state["file"], "w") as f:
        json.dump({"table": list(TABLE.items()), "figures": _state["figures"], "problems": _state["problems"]},
                  f, ensure_ascii=False)


def install(namespace: dict, fonts: list[str], record_file: str):
    """Put ``both``, ``formatted`` and ``called`` in the run's namespace and draw every figure twice.

    Returns the function that undoes it (the kernel never does; a test in a shared process must).
    """
    import matplotlib.backend_bases as backend_bases
    import matplotlib.text as mtext
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    _state.update(file=record_file, fonts=[name for name in fonts if name in installed])
    namespace.update(_tr_text=literal, _tr_both=both, _tr_format=formatted, _tr_call=called, _tr_join=joined)
    font_log = _FontLog()
    logging.getLogger("matplotlib.font_manager").addHandler(font_log)

    draw, layout, print_figure = mtext.Text.draw, mtext.Text._get_layout, backend_bases.FigureCanvasBase.print_figure

    def recording_draw(self, renderer):
        if not _state["translating"]:
            return draw(self, renderer)
        with _translated(self):
            if self.get_visible() and self.get_text().strip() and self.get_text() not in _state["drawn"]:
                _state["drawn"].append(self.get_text())
            return draw(self, renderer)

    def translated_layout(self, renderer):
        if not _state["translating"]:
            return layout(self, renderer)
        with _translated(self):
            return layout(self, renderer)

    def both_figures(self, target, *args, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = print_figure(self, target, *args, **kwargs)
            if isinstance(target, io.BytesIO):
                key = hashlib.sha256(target.getvalue()).hexdigest()
                other = io.BytesIO()
                _state.update(translating=True, drawn=[])
                try:
                    print_figure(self, other, *args, **kwargs)
                finally:
                    _state["translating"] = False
                _state["figures"][key] = {"image": base64.b64encode(other.getvalue()).decode(),
                                          "text": _state["drawn"]}
        for warning in caught:
            _record_problem(str(warning.message))
            if not str(warning.message) in _state["problems"]:  # any other warning is shown as it would be
                warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
        _dump()
        return result

    mtext.Text.draw, mtext.Text._get_layout = recording_draw, translated_layout
    backend_bases.FigureCanvasBase.print_figure = both_figures
    _dump()

    def uninstall():
        mtext.Text.draw, mtext.Text._get_layout = draw, layout
        backend_bases.FigureCanvasBase.print_figure = print_figure
        logging.getLogger("matplotlib.font_manager").removeHandler(font_log)
    return uninstall
