"""Sphinx extension: a link on every page to the same page in the book's other edition.

The staged ``_config.yml`` of each edition sets ``course_edition`` (see ``coursegen.book``):
where the other edition's root is, relative to this one's, and its name in its own language.
Both editions have the same page names, so the link is the page's own path under that root.
"""
from __future__ import annotations

import html


def _link(app, pagename, templatename, context, doctree):
    edition = app.config.course_edition
    if not edition or "body" not in context:
        return
    up = "../" * pagename.count("/")
    href = f"{up}{edition['other_root']}{pagename}.html"
    context["body"] = (
        f'<p class="course-edition-link"><a href="{html.escape(href)}" hreflang="{edition["other_lang"]}" '
        f'lang="{edition["other_lang"]}">{html.escape(edition["other_name"])}</a></p>\n' + context["body"])
    context.setdefault("metatags", "")
    context["metatags"] += f'\n<link rel="alternate" hreflang="{edition["other_lang"]}" href="{html.escape(href)}" />'


def setup(app):
    app.add_config_value("course_edition", {}, "html")
    app.connect("html-page-context", _link)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
