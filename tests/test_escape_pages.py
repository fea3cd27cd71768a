"""Nothing a learner submits runs on a page the grader writes, and what it wrote still shows as text.

The learner opens a feedback page and so does the instructor (issue 45). A Chapter 2 submission
carries a payload in every place a page shows what it was given: its markdown cells (script
tags; handlers on img, svg, body, details and a paragraph; javascript: links in HTML, Markdown and
TeX; SVG with script; iframe srcdoc, object, base, form, meta refresh; MathML hiding a style; an
unclosed style, which would swallow every later cell and verdict), a raw HTML cell, cell tags, an
SVG attachment, widget state in its metadata, a code cell that displays text/html,
application/javascript, image/svg+xml, text/markdown and text/latex, and an answer with markup in
a comment. A class adds a student id and a file name made of markup. Each payload, if it ran,
would set ``document.title`` and a global ``PWNED_<name>``.

Chromium opens each page the real commands write (``grade``'s feedback page, ``grade-class``'s
feedback page, the page of a submission that could not be graded, the class report, the
similarity report), moves the mouse over every element and clicks what would run a link; then
nothing has run, the page has not moved, no handler, javascript: or data: link, frame, form or
base is left, the policy had nothing to refuse (so the page's own MathJax, fonts, styles and
images are all allowed), and the text around each payload still shows. Two more pages need no
grading: every output type rendered through the page's own template (``feedback.render`` keeps
no output of the submission's own, so no grading can show them), and the payloads unsanitised
under each page's policy alone, which must stop them while MathJax still typesets.
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.feedback import FEEDBACK_POLICY
from class_runs import CHAPTER, cli, new_course
from support import ROOT, reference_answers, submission

pytestmark = pytest.mark.pipeline


def runs(name: str) -> str:
    """What a payload does if it runs: the page's title and a global of its own say so."""
    return f"document.title='PWNED {name}';window.PWNED_{name}=1"


def runs_in_parent(name: str) -> str:
    return f"parent.document.title='PWNED {name}';parent.PWNED_{name}=1"


SVG = (f"<svg xmlns='http://www.w3.org/2000/svg' width='40' height='20' onload=\"{runs('svg_file')}\">"
       f"<script>{runs('svg_file_script')}</script><text y='15'>svg</text></svg>")
# name -> (a markdown cell of the learner's, text of it that must still show)
MARKDOWN = {
    "script": (f"<script>{runs('script')}</script>Words after a script tag.", "Words after a script tag."),
    "img_onerror": (f'<img src=x onerror="{runs("img_onerror")}"> Words after an image.', "Words after an image."),
    "svg_onload": (f'<svg onload="{runs("svg_onload")}"><circle r="5"/></svg> Words after an SVG.',
                   "Words after an SVG."),
    "svg_script": (f"<svg><script>{runs('svg_script')}</script></svg> Words after an SVG script.",
                   "Words after an SVG script."),
    "body_onload": (f'<body onload="{runs("body_onload")}"> Words after a body tag.', "Words after a body tag."),
    "onmouseover": (f'<p id="hover" onmouseover="{runs("onmouseover")}">Hover over me.</p>', "Hover over me."),
    "javascript_link": (f'<a id="jslink" href="javascript:{runs("javascript_link")}">Click me.</a>', "Click me."),
    "markdown_link": (f"[A markdown link](<javascript:{runs('markdown_link')}>).", "A markdown link"),
    "iframe_srcdoc": (f'<iframe srcdoc="<script>{runs_in_parent("iframe_srcdoc")}</script>"></iframe> Words after a frame.',
                      "Words after a frame."),
    "object_data": (f'<object data="data:text/html,<script>{runs("object_data")}</script>"></object> Words after an object.',
                    "Words after an object."),
    "form": (f'<form action="javascript:{runs("form")}"><button id="send">Send.</button></form>', "Send."),
    "base": ('<base href="https://example.invalid/"> Words after a base.', "Words after a base."),
    "meta_refresh": ('<meta http-equiv="refresh" content="0;url=about:blank#refreshed"> Words after a refresh.',
                     "Words after a refresh."),
    "details_ontoggle": (f'<details open ontoggle="{runs("details_ontoggle")}"><summary>A summary.</summary>'
                         "Inside the details.</details>", "Inside the details."),
    "tex_href": (f"A formula with a link: $\\href{{javascript:{runs('tex_href')}}}{{x}}$.", "A formula with a link:"),
    "text": ("A literal &lt;script&gt; written as text, and math $a < b$ and $$\\frac{1}{\\sqrt{d_k}}$$",
             "A literal <script> written as text"),
    # last: in a browser they hide the rest of their element (on a page without the sanitiser, the
    # rest of the page: the cells below and every verdict); the policy alone leaves them there
    "mathml_style": (f'Words before MathML. <math><mtext><table><mglyph><style><img src=x onerror="{runs("mathml_style")}">',
                     "Words before MathML."),
    "unclosed_style": ("Words before an unclosed style. <style>body { display: none }", "Words before an unclosed style."),
}
CODE = ("from IPython.display import HTML, SVG, Javascript, Latex, Markdown, display\n"
        f"display(HTML('<script>{runs('out_html')}</script><b>html output</b>'))\n"
        f"display(Javascript(\"{runs('out_js')}\"))\n"
        f"display(SVG({SVG!r}))\n"
        f"display(Markdown('<img src=x onerror=\"{runs('out_markdown')}\">'))\n"
        "display(Latex('$x$ </div><script>document.title=1</script>'))\n"
        f"# </pre></div><script>{runs('code')}</script>\n")
CODE_SHOWN = f"# </pre></div><script>{runs('code')}</script>"
ANSWER_COMMENT = f'# </pre><img src=x onerror="{runs("answer")}">'
RAW = f'<script>{runs("raw_script")}</script><img src=x onerror="{runs("raw_img")}">Words in a raw cell.'


def injected() -> nbformat.NotebookNode:
    """Chapter 2's reference (10 / 10) with every payload: a learner's cells after the first one."""
    answer = reference_answers(CHAPTER)["scaled_dot_product_attention"] + "\n" + ANSWER_COMMENT + "\n"
    nb = submission({"scaled_dot_product_attention": answer}, chapter=CHAPTER)
    cells = [nbformat.v4.new_markdown_cell(f"**{name}**: {source}") for name, (source, _) in MARKDOWN.items()]
    attached = nbformat.v4.new_markdown_cell("An attachment: ![an SVG attachment](attachment:evil.svg)")
    attached["attachments"] = {"evil.svg": {"image/svg+xml": base64.b64encode(SVG.encode()).decode()}}
    cells.append(attached)
    cells.append(nbformat.v4.new_raw_cell(RAW, metadata={"raw_mimetype": "text/html"}))
    cells.append(nbformat.v4.new_code_cell(CODE, metadata={"tags": [f'"><img src=x onerror="{runs("cell_tag")}">']}))
    if nb.nbformat_minor < 5:  # the learner notebook's version has no cell ids
        for cell in cells:
            cell.pop("id", None)
    nb.cells[1:1] = cells
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "version_major": 2, "version_minor": 0, "state": {"x": f"</script><script>{runs('widget_state')}</script>"}}}
    return nb


SHOWN = [shown for _, shown in MARKDOWN.values()] + ["An attachment:", "Words in a raw cell.", CODE_SHOWN,
                                                      ANSWER_COMMENT]

# --------------------------------------------------------------------------- the browser
# Before any page script: note what the policy refuses (a DevTools script, which no policy covers).
WATCH = ("window.CSP_BLOCKED = [];"
         "document.addEventListener('securitypolicyviolation', e => "
         "CSP_BLOCKED.push(e.effectiveDirective + ' ' + (e.blockedURI || 'inline')));")

VISIT = r"""
(async () => {
  const settle = ms => new Promise(r => setTimeout(r, ms));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await settle(300);
  // what a reader does: the mouse over everything, then a click on whatever would follow a link or send
  for (const el of document.querySelectorAll("body *")) {
    for (const type of ["mouseover", "mouseenter", "mousemove", "focus"]) el.dispatchEvent(new Event(type));
  }
  for (const el of document.querySelectorAll("#jslink, #send, button, mjx-container a, a[href^='javascript' i]")) {
    el.click();
  }
  await settle(300);
  const attrs = [...document.querySelectorAll("*")].flatMap(e => [...e.attributes].map(a => [e.localName, a.name, a.value]));
  return {
    path: location.protocol + decodeURIComponent(location.pathname) + location.hash, title: document.title,
    ran: Object.keys(window).filter(k => k.startsWith("PWNED")),
    blocked: window.CSP_BLOCKED || null,
    handlers: attrs.filter(([t, n]) => /^on/i.test(n)).map(([t, n]) => `${t}[${n}]`),
    urls: attrs.filter(([t, n, v]) => /^\s*(javascript|vbscript):/i.test(v) ||
                       (/^(href|src|action|formaction|data|srcdoc|xlink:href)$/i.test(n) && /^\s*data:/i.test(v) &&
                        !(t === "img" && n === "src" && /^data:image\//i.test(v))))
               .map(([t, n, v]) => `${t}[${n}]=${v.slice(0, 60)}`),
    elements: [...document.querySelectorAll("iframe, frame, object, embed, base, form, meta[http-equiv='refresh' i], "
                                             + "body script, body style, svg script")].map(e => e.localName),
    scripts: [...document.scripts].map(s => s.src || "inline"),
    policy: [...document.querySelectorAll("meta[http-equiv='Content-Security-Policy' i]")].map(m => m.content),
    text: document.body.innerText,
    math: document.querySelectorAll("mjx-container").length,
    mathErrors: document.querySelectorAll("mjx-merror, [data-mjx-error]").length,
    images: [...document.images].map(i => [(i.getAttribute("src") || "").slice(0, 22), i.naturalWidth]),
    verdicts: document.querySelectorAll(".verdict").length,
    highlighted: document.querySelectorAll(".highlight span").length,
  };
})()
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from system_packages import chromium
    from test_book import DevTools  # the book's browser driver
    devtools = DevTools(chromium(), tmp_path_factory.mktemp("chromium") / "profile")
    try:
        devtools.call("Page.addScriptToEvaluateOnNewDocument", source=WATCH)
        yield devtools
    finally:
        devtools.close()


def visit(browser, page: Path) -> dict:
    assert page.is_file(), page
    browser.open(page.as_uri())
    return browser.evaluate(VISIT)


def assert_ran_nothing(seen: dict, page: Path, title: str, shown=(), policy: str | None = None):
    """Nothing ran, nothing was left that could, the page has its POLICY (default: no script at all)
    and it refused nothing, and SHOWN shows."""
    from autograder import html_safety
    assert seen["path"] == f"file:{page}", f"the page navigated to {seen['path']}"
    assert seen["policy"] == [policy or html_safety.policy()], seen["policy"]
    assert seen["ran"] == [] and seen["title"] == title, (seen["ran"], seen["title"])
    assert seen["handlers"] == [] and seen["urls"] == [] and seen["elements"] == [], seen
    assert seen["blocked"] == [], f"the policy had to refuse {seen['blocked']}"
    missing = [text for text in shown if text not in seen["text"]]
    assert not missing, f"no longer shown as text: {missing}"


def assert_reads_like_before(seen: dict):
    """The feedback page still shows what it did: typeset math, highlighted code, every verdict."""
    assert seen["math"] > 100 and seen["mathErrors"] == 0, (seen["math"], seen["mathErrors"])
    assert seen["highlighted"] > 500 and seen["verdicts"] == 10, (seen["highlighted"], seen["verdicts"])
    # nbgrader's total holds the written answer (2 points, graded by hand) beside the 10 automatic ones
    assert "Score: 10.0 / 12.0" in seen["text"], seen["text"][:300]
    scripts = [s for s in seen["scripts"] if s != "inline"]
    assert seen["scripts"].count("inline") == 1 and scripts, seen["scripts"]  # MathJax's configuration, then MathJax
    assert all("/_static/mathjax/" in s for s in scripts), scripts
    attachment = [src for src, width in seen["images"] if src.startswith("data:image/svg+xml")]
    assert attachment, seen["images"]  # the SVG attachment shows, as an image


# --------------------------------------------------------------------------- one submission: grade
@pytest.fixture(scope="module")
def graded_page(tmp_path_factory) -> Path:
    """The injected submission graded by ``python -m autograder grade --feedback-dir``."""
    tmp = tmp_path_factory.mktemp("escape-grade")
    path = tmp / "submission" / f"{CHAPTER}.ipynb"
    path.parent.mkdir()
    nbformat.write(injected(), path)
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path), "--json", "--student", "ada",
                           "--feedback-dir", str(tmp / "feedback")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["score"] == 10.0  # the payloads cost the submission nothing
    return tmp / "feedback" / f"ada-{CHAPTER}.html"


def test_the_feedback_page_of_grade_runs_nothing_and_shows_every_word(graded_page, browser):
    seen = visit(browser, graded_page)
    assert_ran_nothing(seen, graded_page, CHAPTER, SHOWN, FEEDBACK_POLICY)
    assert_reads_like_before(seen)


# --------------------------------------------------------------------------- a class: grade-class
STUDENT = f'<img src=x onerror="{runs("student_id")}">'
UNGRADABLE = f'<svg onload="{runs("other_student_id")}"> & co'
FILE_NAME = f'<img src=x onerror="{runs("file_name")}">.ipynb'


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory, released_class) -> Path:
    """A class of two whose student ids and file name are markup: the injected submission, graded,
    and an empty file, which cannot be (its reason names the file)."""
    tmp = tmp_path_factory.mktemp("escape-class")
    course = new_course(tmp, released_class, students=set())
    for student, name in ((STUDENT, f"{CHAPTER}.ipynb"), (UNGRADABLE, FILE_NAME)):
        (course / "submitted" / student / CHAPTER).mkdir(parents=True)
    nbformat.write(injected(), course / "submitted" / STUDENT / CHAPTER / f"{CHAPTER}.ipynb")
    (course / "submitted" / UNGRADABLE / CHAPTER / FILE_NAME).write_text("")
    proc = cli("grade-class", "--course", str(course), "--workers", "1")
    assert "1 graded, 1 could not be graded" in proc.stdout, proc.stdout + proc.stderr
    return course


def test_the_feedback_page_of_grade_class_runs_nothing(graded_class, browser):
    page = graded_class / "feedback" / STUDENT / CHAPTER / f"{CHAPTER}.html"
    seen = visit(browser, page)
    assert_ran_nothing(seen, page, CHAPTER, SHOWN, FEEDBACK_POLICY)
    assert_reads_like_before(seen)


def test_the_page_of_a_submission_that_could_not_be_graded_shows_its_id_and_file_as_text(graded_class, browser):
    page = graded_class / "feedback" / UNGRADABLE / CHAPTER / f"{CHAPTER}.html"
    seen = visit(browser, page)
    assert_ran_nothing(seen, page, f"{CHAPTER}: feedback for {UNGRADABLE}",
                       [f"{CHAPTER}: feedback for {UNGRADABLE}", f"{FILE_NAME}: the file is empty"])


def test_the_class_report_shows_ids_and_file_names_as_text(graded_class, browser):
    page = graded_class / "class-report.html"
    seen = visit(browser, page)
    assert_ran_nothing(seen, page, f"Class report: {graded_class.name}",
                       [f"{STUDENT}\t10", UNGRADABLE, f"{FILE_NAME}: the file is empty"])
    assert len(seen["images"]) == 2 and all(width > 200 for _, width in seen["images"]), seen["images"]


def test_the_similarity_report_shows_ids_and_answers_as_text(graded_class, browser):
    page = graded_class / "class-similarity.html"
    seen = visit(browser, page)
    assert_ran_nothing(seen, page, f"Similar answer cells: {graded_class.name}", [STUDENT, ANSWER_COMMENT])


# --------------------------------------------------------------------------- no grading needed
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGM8ISfHwMDAxMDAwMDAAAANBAEIfXHKZgAAAABJRU5ErkJggg=="  # 2 x 2


def _outputs() -> list:
    out = nbformat.v4.new_output
    return [
        out("display_data", data={"text/html": f"<script>{runs('html_output')}</script><b>Bold HTML output.</b>"
                                                f"<img src=x onerror=\"{runs('html_output_img')}\">"
                                                "<table><tr><td>A table cell.</td></tr></table>"}),
        out("display_data", data={"text/html": f"<script>{runs('isolated')}</script>An isolated output."},
            metadata={"text/html": {"isolated": True}}),
        out("display_data", data={"application/javascript": runs("javascript_output")}),
        out("display_data", data={"image/svg+xml": SVG}),
        out("display_data", data={"text/markdown": f"<img src=x onerror=\"{runs('markdown_output')}\"> Markdown output."}),
        out("display_data", data={"text/latex": f"$y$ </div><script>{runs('latex_output')}</script>"}),
        out("display_data", data={"application/vnd.jupyter.widget-view+json": {
            "model_id": f"</script><script>{runs('widget_view')}</script>", "version_major": 2, "version_minor": 0},
            "text/plain": "A widget."}),
        out("display_data", data={"image/png": PNG, "text/plain": "a PNG"}, metadata={"image/png": {"alt": "A PNG."}}),
        out("stream", name="stdout", text=f"<script>{runs('stdout')}</script> Printed words.\n"),
        out("execute_result", data={"text/plain": f"<script>{runs('result')}</script> A result."}, execution_count=1),
        out("error", ename="ValueError", evalue="<b>", traceback=[f"<script>{runs('traceback')}</script> A traceback."]),
    ]


def test_every_output_type_is_sanitised_by_the_page_s_own_template(tmp_path, browser):
    """``render`` keeps no output of the submission, so these never reach a page today; were one
    kept, the page's template would show it as this page does."""
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    from autograder import feedback
    nb = nbformat.v4.new_notebook(metadata=injected().metadata)
    nb.cells = [nbformat.v4.new_markdown_cell(MARKDOWN["script"][0]),
                nbformat.v4.new_code_cell("print('hello')", outputs=_outputs(), execution_count=1,
                                          metadata={"tags": [f'"><img src=x onerror="{runs("tag")}">']}),
                nbformat.v4.new_raw_cell(RAW, metadata={"raw_mimetype": "text/html"})]
    exporter = HTMLExporter(config=feedback.page_config(Config()))
    for step in feedback.page_steps():
        exporter.register_preprocessor(step, enabled=True)
    html, _ = exporter.from_notebook_node(nb, {"nbgrader": {"notebook": CHAPTER, "score": 0, "max_score": 10,
                                                            "late_penalty": 0}})
    assert feedback.has_policy(html)  # render() hands out no page without it
    page = feedback.write_page(tmp_path / "feedback", f"ada-{CHAPTER}.html", html)
    seen = visit(browser, page)
    assert_ran_nothing(seen, page, CHAPTER, ["Bold HTML output.", "A table cell.", "Markdown output.", "A widget.",
                                             "Printed words.", "A result.", "A traceback.", "Words in a raw cell.",
                                             MARKDOWN["script"][1]], FEEDBACK_POLICY)
    assert f"<script>{runs('stdout')}</script>" in seen["text"]  # text outputs are text
    widths = {src.split(";")[0]: width for src, width in seen["images"] if src}
    assert widths == {"data:image/png": 2, "data:image/svg+xml": 40}, seen["images"]  # both show, as images
    assert seen["math"] >= 1 and seen["mathErrors"] == 0  # the LaTeX output is typeset


# inline scripts, handlers, the object's data: page, the base, the form's javascript: action
REFUSED = {"script-src-elem", "script-src-attr", "object-src", "base-uri", "form-action"}
PLAIN_PAYLOADS = [source for name, (source, _) in MARKDOWN.items() if name not in ("meta_refresh", "unclosed_style")]


def test_the_policy_alone_stops_the_payloads_and_lets_the_page_typeset(tmp_path, browser):
    """Each page's policy, were a payload to get past the sanitiser (a meta refresh, which no
    policy stops, is the sanitiser's alone): the feedback page's MathJax still runs."""
    from autograder.classroom.class_report import _page
    from autograder.feedback import MATHJAX_SCRIPT, write_page
    from autograder.html_safety import csp_meta
    payloads = '<p>$\\sqrt{d_k}$</p><p>The start.</p>\n' + "\n".join(f"<p>{p}</p>" for p in PLAIN_PAYLOADS)
    page = write_page(tmp_path / "feedback", "page.html",
                      f"<!DOCTYPE html><html><head><meta charset='utf-8'>{csp_meta(FEEDBACK_POLICY)}"
                      f"<title>t</title><script>{MATHJAX_SCRIPT}</script></head><body>{payloads}</body></html>")
    seen = visit(browser, page)
    assert seen["ran"] == [] and seen["title"] == "t", seen
    assert seen["math"] >= 3 and seen["mathErrors"] == 0, seen  # MathJax ran: its files, fonts and styles allowed
    assert REFUSED <= {b.split()[0] for b in seen["blocked"]}, seen["blocked"]  # the policy, not chance, stopped them
    report = tmp_path / "report.html"
    report.write_text(_page("t", payloads))
    seen = visit(browser, report)
    assert seen["ran"] == [] and seen["title"] == "t" and "The start." in seen["text"], seen
    assert REFUSED <= {b.split()[0] for b in seen["blocked"]}, seen["blocked"]
