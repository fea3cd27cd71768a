"""What a page built from submitted content may hold: one sanitiser, one escaping helper, one policy.

Every page the grader writes for a person to open (a feedback page, the class report, the
similarity report) shows text that a learner chose: markdown and code cells, outputs,
cell metadata and attachments, student ids, file names. None of it may run there.

* ``cells``: the rendered HTML of a notebook's cells, sanitised with nh3 (the Python binding
  to Rust's ammonia, an HTML5 parser with an allow-list): no script, style, frame, object,
  form or event handler survives, links keep http(s), mailto and in-page targets, images
  only ``data:image/...`` URIs. What a feedback page shows stays: highlighted code (classes),
  markdown with its math (text, typeset later), tables, headings and their anchors.
* ``text``: anything the grader itself puts into a page (a student id, a file name, a
  message), escaped for an element's content and for a quoted attribute alike.
* ``policy`` and ``csp_meta``: the page's Content-Security-Policy, as a ``<meta http-equiv>``
  at the top of its head: nothing but the page's own styles and data: images; a feedback page
  also runs its one MathJax configuration script (by its hash) and the MathJax files beside it
  (``'self'``), never an inline script or handler added to the page.
"""
from __future__ import annotations

import base64
import hashlib
import html
import re

import nh3

# The tags and attributes the rendered cells use (nbconvert's classic template, nbgrader's
# feedback, Pygments, mistune, our verdicts and admonitions), within ammonia's defaults.
TAGS = set(nh3.ALLOWED_TAGS)
ATTRIBUTES = {**{tag: set(names) for tag, names in nh3.ALLOWED_ATTRIBUTES.items()},
              "*": {"class", "id", "title"},  # classes style code and cells; ids are the headings' anchors
              "a": {"href", "hreflang", "name"},  # nbgrader's anchors are <a name=...>
              "details": {"open"},
              "img": {"src", "alt", "width", "height", "align"}}
URL_SCHEMES = {"http", "https", "mailto", "data"}  # data: for images only (``_kept``)
DROPPED_WITH_CONTENT = {"script", "style"}  # the others lose their tags, their text stays text
_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml)(;[\w=.+-]+)*(;base64)?,", re.I)


def _kept(tag: str, attribute: str, value: str) -> str | None:
    """An image's source is a data: URI of an image (an <img> never runs what it shows), and a
    data: URI is nothing else's (a link to one could open a page of the learner's)."""
    if tag == "img" and attribute == "src":
        return value if _IMAGE.match(value.strip()) else None
    if attribute in ("href", "cite") and value.strip()[:5].lower() == "data:":
        return None
    return value


_CLEANER = nh3.Cleaner(tags=TAGS, attributes=ATTRIBUTES, url_schemes=URL_SCHEMES, attribute_filter=_kept,
                       clean_content_tags=DROPPED_WITH_CONTENT, strip_comments=True)


def cells(fragment) -> str:
    """The rendered HTML of a notebook's cells with nothing left that could run."""
    return _CLEANER.clean(str(fragment))


def text(value) -> str:
    """VALUE as HTML text, for an element's content or a quoted attribute value."""
    return html.escape(str(value), quote=True)


# No script at all: the class report, the similarity report, the pages without a notebook.
NO_SCRIPT = {"default-src": "'none'", "style-src": "'unsafe-inline'", "img-src": "data:",
             "base-uri": "'none'", "form-action": "'none'"}


def script_hash(source: str) -> str:
    """The CSP source that lets exactly this inline script run."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


def policy(*scripts: str, fonts: bool = False) -> str:
    """A page's policy: NO_SCRIPT, or with these inline SCRIPTS and the script files beside the
    page ('self'; a page opened as a file: URL matches file: URLs in Chromium and Firefox), and
    FONTS from there (MathJax's)."""
    directives = {"default-src": NO_SCRIPT["default-src"]}
    if scripts:
        directives["script-src"] = " ".join(["'self'", *map(script_hash, scripts)])
    directives.update(NO_SCRIPT)
    if fonts:
        directives["font-src"] = "'self'"
    return "; ".join(f"{name} {value}" for name, value in directives.items())


def csp_meta(content: str) -> str:
    """The policy as the first thing a page's head holds (it covers only what follows it)."""
    return f'<meta http-equiv="Content-Security-Policy" content="{text(content)}">'
