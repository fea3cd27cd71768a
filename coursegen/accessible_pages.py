"""Sphinx extension: the course's pages as axe-core and screen readers want them (see tests/test_accessibility.py).

- A collapsed visible test opens with MyST-NB's toggle, a ``<summary>`` named
  "Toggle hidden content" by ``aria-label`` while it shows "Show code cell source": a
  screen reader then reads a name that differs from what a sighted reader sees (and a
  voice-control user cannot say it). Without the label, the shown words are its name.
- Those words are in the edition's language (MyST-NB's ``nb_code_prompt_show`` and
  ``nb_code_prompt_hide``).
"""
from __future__ import annotations

MYST_NB_TOGGLE = '<summary aria-label="Toggle hidden content">'
# (show, hide) for a collapsed code cell; MyST-NB's English otherwise
TOGGLE_WORDS = {"zh_CN": ("显示代码", "隐藏代码")}


def _toggle_words(app, config):
    words = TOGGLE_WORDS.get(config.language)
    if words:
        config.nb_code_prompt_show, config.nb_code_prompt_hide = words


def _named_by_its_words(app, pagename, templatename, context, doctree):
    if "body" in context:
        context["body"] = context["body"].replace(MYST_NB_TOGGLE, "<summary>")


def setup(app):
    app.connect("config-inited", _toggle_words, priority=100)  # before MyST-NB reads its settings
    app.connect("html-page-context", _named_by_its_words)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
