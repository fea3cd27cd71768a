"""Sphinx extension: the Colab and Binder buttons of a chapter open that edition's learner notebook.

sphinx-book-theme builds each launch URL from the page's path in the book
(``chapters/NAME.ipynb``). The English learner notebooks are at that path in the repository;
a translation's are in their own folder (``chapters/zh_CN/NAME.ipynb``). The staged
``_config.yml`` sets ``course_notebook_folder`` to the edition's folder (``coursegen.book``),
and this handler, run after the theme's, puts it into the launch URLs.
"""
from __future__ import annotations

THEME_FOLDER = "chapters"


def _point_at_learner_notebook(app, pagename, templatename, context, doctree):
    folder = app.config.course_notebook_folder
    if not folder or folder == THEME_FOLDER or not pagename.startswith(THEME_FOLDER + "/"):
        return
    theirs, ours = f"/{pagename}.ipynb", f"/{folder}/{pagename[len(THEME_FOLDER) + 1:]}.ipynb"
    for group in context.get("header_buttons", []):
        if group.get("label") == "launch-buttons":
            for button in group["buttons"]:
                if button.get("url"):
                    button["url"] = button["url"].replace(theirs, ours)


def setup(app):
    app.add_config_value("course_notebook_folder", "", "html")
    app.connect("html-page-context", _point_at_learner_notebook, priority=900)  # after the theme's (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
