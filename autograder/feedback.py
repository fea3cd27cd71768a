"""Every feedback page a learner gets, and where it is written.

A graded submission's page (``render``) is nbgrader's feedback in which test cells show
the judge's verdict, never the hidden test source; when that page cannot be made safely, the
submission gets its scores and verdicts alone (``scores_page``). A submission that could not be
graded gets a page that says why (``unavailable_page``). All are written by ``write_page``,
which puts the MathJax they need beside them.

The graded page is nbgrader's ``generate_feedback`` with a template of ours
(``feedback_template/course_feedback``) so that it reads like the book: math typeset by
the MathJax the book ships (copied once into the feedback folder, ``install_mathjax``;
no network), MyST admonitions as boxes (``myst.MystDirectives``), and the summary naming
each test by its grade id.

Nothing a learner submitted runs on any of these pages (``html_safety``): the rendered cells
are sanitised with nh3, what the grader inserts is escaped, and each page carries a
Content-Security-Policy that allows no script but its own MathJax configuration (by hash)
and the MathJax files beside it.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
from html import unescape as html_unescape
from pathlib import Path

import nbformat
from nbconvert.preprocessors import Preprocessor
from nbgrader.preprocessors import ClearHiddenTests
from traitlets import Unicode

from coursekit import conventions as C
from coursekit import nbgrader_course

from . import myst
from .html_safety import cells, csp_meta, policy, text
from .messages import msg, tell

TEMPLATES = Path(__file__).resolve().parent / "feedback_template"
MATHJAX_FOLDER = "_static/mathjax"  # in the feedback folder; no student id starts with "_"
# Where a page finds it: class pages are feedback/<student>/<chapter>/<chapter>.html,
# `grade --feedback-dir DIR` writes DIR/<student>-<chapter>.html.
MATHJAX_URLS = (f"../../{MATHJAX_FOLDER}/tex-chtml.js", f"{MATHJAX_FOLDER}/tex-chtml.js")
# The parts of MathJax 3 that typeset TeX as HTML (the speech engine, 4 MB, is left out).
MATHJAX_PARTS = ("tex-chtml.js", "input/tex/extensions", "output/chtml/fonts/woff-v2", "ui", "a11y")
# The page's one script: MathJax's configuration, then MathJax from the first of MATHJAX_URLS
# that loads. Its hash is in the page's policy; any other inline script or handler is refused.
# MathJax's safe extension (ui/safe) keeps \href, \class, \style and \require of the
# learner's TeX to harmless values.
MATHJAX_SCRIPT = r"""
window.MathJax = {
  loader: {load: ['ui/safe']},
  tex: {inlineMath: [['$', '$'], ['\\(', '\\)']], displayMath: [['$$', '$$'], ['\\[', '\\]']],
        processEscapes: true, processEnvironments: true, tags: 'ams'},
  options: {enableMenu: false},
  chtml: {displayAlign: 'center'}
};
(function () {
  var urls = %s;
  function load(i) {
    if (i >= urls.length) { return; }
    var script = document.createElement('script');
    script.src = urls[i];
    script.async = true;
    script.onerror = function () { script.remove(); load(i + 1); };
    document.head.appendChild(script);
  }
  load(0);
})();
""" % json.dumps(list(MATHJAX_URLS))
FEEDBACK_POLICY = policy(MATHJAX_SCRIPT, fonts=True)


class PageResources(Preprocessor):
    """What our template needs beside the notebook: MathJax locations, the admonition styles,
    and the page's own words in the submission's language."""

    enabled = True  # nbconvert preprocessors are off unless enabled
    language = Unicode(C.SOURCE_LANGUAGE).tag(config=True)

    def preprocess(self, nb, resources):
        words = {key: text(tell(said, self.language)) for key, said in PAGE_WORDS.items()}
        resources["course_feedback"] = {"script": MATHJAX_SCRIPT, "csp": csp_meta(FEEDBACK_POLICY),
                                        "css": myst.CSS + VERDICT_CSS, "words": words,
                                        "lang": text(self.language.replace("_", "-"))}
        return nb, resources


# A test cell's verdict (``verdict_output``): green when passed, red with its reasons otherwise.
VERDICT_CSS = """
.verdict { margin: 0.3em 0; padding: 0.4em 0.8em; border-left: 0.25em solid; border-radius: 0.2em; }
.verdict-passed { border-color: #198754; background: #eff8f3; }
.verdict-failed { border-color: #dc3545; background: #fdf0f1; }
.verdict p { margin: 0; } .verdict ul { margin: 0.3em 0 0; padding-left: 1.4em; }
.verdict code { background: rgba(0, 0, 0, 0.06); padding: 0 0.2em; border-radius: 0.2em; }
"""

PAGE_WORDS = {"score": msg("Score"), "comment": msg("Comment"), "late": msg("Late submission penalty"),
              "answer": msg("Student's answer"), "task": msg("Student's task"), "grade_cell": msg("Grade cell:"),
              "task_cell": msg("Task:"), "top": msg("(Top)"), "comments": msg("Comments:")}
# The labels nbgrader's feedback template writes in each graded cell's heading and footer, as it
# writes them (its macros nbgrader_heading, score and nbgrader_footer), and the word each becomes.
_LABELS = ((re.compile(r'(<span class="nbgrader-label">)Student\'s answer(</span>)'), "answer"),
           (re.compile(r'(<span class="nbgrader-label">)Student\'s task(</span>)'), "task"),
           (re.compile(r'(<span class="nbgrader-label">)Grade cell:( <code>)'), "grade_cell"),
           (re.compile(r'(<span class="nbgrader-label">)Task:( <code>)'), "task_cell"),
           (re.compile(r'(<span class="pull-right">\s*)Score:( )'), "score"),
           (re.compile(r'(<a href="#top">)\(Top\)(</a>)'), "top"),
           (re.compile(r'(<b>)Comments:(</b>)'), "comments"))


def page_labels(html: str, words: dict) -> str:
    """A rendered cell (HTML) with nbgrader's English labels in the page's words (already escaped);
    the score label keeps its colon (the summary writes it so)."""
    for pattern, key in _LABELS:
        word = words[key] + (":" if key == "score" else "")
        html = pattern.sub(lambda m: m[1] + word + m[2], html)
    return html


def generate_feedback(course: Path, chapter: str, student: str, language: str = C.SOURCE_LANGUAGE) -> dict:
    """nbgrader's generate_feedback for one submission, with our template and preprocessors.

    (``NbGraderAPI.generate_feedback`` forces nbgrader's own template, so the converter is
    run here the way that method runs it.)
    """
    from nbgrader.converters import GenerateFeedback
    from nbgrader.preprocessors import GetGrades
    from nbgrader.utils import capture_log, temp_attrs
    cfg = page_config(nbgrader_course.config(course), language)
    cfg.GenerateFeedback.preprocessors = [GetGrades, *page_steps()]
    api = nbgrader_course.api(course, cfg)
    with temp_attrs(api.coursedir, assignment_id=chapter, student_id=student):
        app = GenerateFeedback(coursedir=api.coursedir, parent=api)
        app.force = True
        return capture_log(app)


def page_config(cfg, language: str = C.SOURCE_LANGUAGE):
    """CFG (an nbconvert config) set to render our page: its template, its filters (the
    sanitiser and the escaping helper) and its words' language."""
    import nbgrader
    formgrader = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader"
    cfg.HTMLExporter.template_name = "course_feedback"  # conf.json: based on nbgrader's "feedback"
    cfg.HTMLExporter.template_file = "course_feedback.html.j2"
    cfg.HTMLExporter.extra_template_basedirs = [str(TEMPLATES), str(formgrader / "templates")]
    # its bootstrap.min.css (GenerateFeedback sets the same; a bare HTMLExporter needs it too)
    cfg.HTMLExporter.extra_template_paths = [str(formgrader / "static" / "node_modules" / "bootstrap" / "dist" / "css")]
    # our template's, and nbconvert's own cleaner (bleach; its classic template cleans raw cells) as ours
    cfg.HTMLExporter.filters = {"sanitised_cells": cells, "escaped": text, "clean_html": cells,
                                "page_labels": page_labels}
    cfg.PageResources.language = language
    return cfg


def page_steps() -> list:
    """The preprocessors our page needs after nbgrader's GetGrades (which reads the gradebook)."""
    from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
    return [CSSHTMLHeaderPreprocessor, myst.MystDirectives, PageResources]


def mathjax_source() -> Path | None:
    """The MathJax 3 that the book serves offline (the sphinx-mathjax-offline package)."""
    try:
        folder = Path(importlib.metadata.distribution("sphinx-mathjax-offline")
                      .locate_file("sphinx-mathjax-offline/static/mathjax"))
    except importlib.metadata.PackageNotFoundError:
        return None
    return folder if (folder / "tex-chtml.js").is_file() else None


def install_mathjax(feedback_folder: Path) -> bool:
    """Copy MathJax into FEEDBACK_FOLDER/_static/mathjax once; False if it is not installed."""
    source, target = mathjax_source(), Path(feedback_folder) / MATHJAX_FOLDER
    if target.is_dir():
        return True
    if source is None:
        return False
    partial = target.with_name(f".{target.name}-{os.getpid()}")  # complete, or not there at all
    shutil.rmtree(partial, ignore_errors=True)
    for part in MATHJAX_PARTS:
        if (source / part).is_dir():
            shutil.copytree(source / part, partial / part)
        elif (source / part).is_file():
            partial.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / part, partial / part)
    try:
        partial.rename(target)
    except OSError:  # another process was quicker
        shutil.rmtree(partial, ignore_errors=True)
    return target.is_dir()


def write_page(folder: Path, name: str | Path, page: str) -> Path:
    """PAGE written at FOLDER/NAME (complete or not at all), with MathJax installed once in FOLDER;
    ValueError for a NAME that would put it anywhere else (``..``, an absolute path, a link out)."""
    target = Path(folder) / name
    resolved_folder = Path(folder).resolve()
    if Path(name).is_absolute() or resolved_folder not in target.resolve().parents:
        raise ValueError(f"a feedback page must stay inside {folder}: {str(name)[:200]!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    install_mathjax(folder)  # the pages' math, offline
    partial = target.with_name(f".{target.name}-{os.getpid()}")
    partial.write_text(page, encoding="utf-8")
    partial.replace(target)
    return target


def _head(title: str, language: str) -> str:
    """The start of a page without a notebook, up to its body: no script may run there."""
    return (f"<!DOCTYPE html><html lang='{text(language.replace('_', '-'))}'><head><meta charset='utf-8'>"
            f"{csp_meta(policy())}<title>{title}</title></head><body><h1>{title}</h1>")


def unavailable_page(student: str, chapter: str, max_score: float, reason: str, language: str) -> str:
    """The page of a submission that could not be graded: its score (0) and the reason."""
    def told(message):
        return text(tell(message, language))
    title = told(msg("{chapter}: feedback for {student}", chapter=chapter, student=student))
    return (_head(title, language) +
            f"<p>{told(msg('Score'))}: 0 / {max_score:g}</p>"
            f"<p>{told(msg('This submission could not be graded: {reason}', reason=reason or msg('no reason recorded')))}</p>"
            "</body></html>\n")


def scores_page(student: str, chapter: str, outcomes, language: str) -> str:
    """The page of a graded submission whose full page could not be made safely (nbgrader's page
    failed, or held a hidden test's text): its score and each test's verdict, as the full page
    shows them, without the notebook."""
    def told(message):
        return text(tell(message, language))
    title = told(msg("{chapter}: feedback for {student}", chapter=chapter, student=student))
    score, points = sum(o.score for o in outcomes), sum(o.points for o in outcomes)
    parts = [_head(title, language),
             f"<p>{told(msg('Score'))}: {score:g} / {points:g}</p>",
             f"<p>{told(msg('The full page of this feedback could not be made; here is each test and why it lost points.'))}</p>"]
    for exercise in dict.fromkeys(o.exercise for o in outcomes):
        parts.append(f"<h2>{text(exercise)}</h2>")
        for o in (o for o in outcomes if o.exercise == exercise):
            parts.append(f"<h3>{text(o.test_id)}</h3>{verdict_output(o, language).data['text/html']}")
    return "".join(parts) + "</body></html>\n"


def render(course: Path, chapter, student: str, autograded: Path, outcomes, submitted_text: str) -> str | None:
    """Write the verdicts into the autograded notebook and run generate_feedback: the page's
    HTML, or None if it could not be made safely."""
    by_id = {o.test_id: o for o in outcomes}
    nb = nbformat.read(autograded, as_version=4)
    ClearHiddenTests(enforce_metadata=False).preprocess(nb, {})
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outcome = by_id.get(C.grade_id(cell))
        if outcome is None:
            cell.outputs = []  # the submission's own outputs stay in the submission
            continue
        cell.outputs = [verdict_output(outcome, chapter.language)]
    nbformat.write(nb, autograded)
    result = generate_feedback(course, chapter.name, student, chapter.language)
    page = course / "feedback" / student / chapter.name / f"{chapter.name}.html"
    if not result["success"] or not page.exists():
        return None
    html = page.read_text(errors="replace")
    if reveals_hidden_source(html, chapter.hidden_lines, submitted_text) or not has_policy(html):
        page.unlink()  # never hand out hidden test source, nor a page without its policy; the scores stand
        return None
    return html


def verdict_output(outcome, language) -> nbformat.NotebookNode:
    """A test cell's verdict as the page shows it: HTML in which `code` is code and several
    reasons are a list (plain text beside it, for any other viewer)."""
    told = [tell(p, language) for p in outcome.problems]

    def line(verdict):
        return tell(msg("{score} / {points} points: {verdict}", score=f"{outcome.score:g}",
                        points=f"{outcome.points:g}", verdict=verdict), language)
    if not told:
        plain = line(tell(msg("passed"), language))
        page = f'<p class="verdict verdict-passed">{as_html(plain)}</p>'
    elif len(told) == 1:
        plain = line(told[0])
        page = f'<p class="verdict verdict-failed">{as_html(plain)}</p>'
    else:
        head = line("").rstrip()
        plain = "\n".join([head, *(f"- {p}" for p in told)])
        items = "".join(f"<li>{as_html(p)}</li>" for p in told)
        page = f'<div class="verdict verdict-failed"><p>{as_html(head)}</p><ul>{items}</ul></div>'
    return nbformat.v4.new_output("display_data", data={"text/html": page, "text/plain": plain})


def as_html(words: str) -> str:
    """Escaped text in which Markdown's `code` spans become <code> (the messages' only markup)."""
    return re.sub(r"`([^`\n]+)`", r"<code>\1</code>", text(words))


def has_policy(page: str) -> bool:
    """Does the page's Content-Security-Policy come before its first script (nbgrader's
    template, which ours edits, could change)?"""
    return 'http-equiv="Content-Security-Policy"' in page.split("<script", 1)[0]


def reveals_hidden_source(page: str, hidden_lines, submitted_text: str) -> bool:
    """Does rendered feedback contain a hidden-test line the submission did not write itself?"""
    plain = html_unescape(re.sub(r"<[^>]+>", "", page))
    return "BEGIN HIDDEN TESTS" in plain or any(
        line in plain and line not in submitted_text for line in hidden_lines)
