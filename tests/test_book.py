"""The built book: no solution leaks, the learner notebook as download, offline math, figures.

The book is built once per test run (``book``) by ``python -m coursegen.book`` (the same command
as ``make book``; warm builds reuse the executed-notebook cache in ``_build/executed``, and a book
built from what a build would read now is left as it is).
The browser checks open the pages in headless Debian Chromium, served from 127.0.0.1,
and drive it over the DevTools protocol (``websocket-client``); Chromium is installed
with apt-get when missing (``tests/system_packages.py``). Each page of both editions is
visited once per run (``page_visits``): the chapter checks here and axe-core's
(``test_accessibility``) read what it showed.
"""
from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import functools
import http.server
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from bs4 import BeautifulSoup

import system_packages
from run_once import once, run_folder

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
CHAPTERS = re.findall(r"file:\s*chapters/(\S+)", (ROOT / "_toc.yml").read_text())
MIN_FIGURES = 3
MIN_MATH = 20


EDITIONS = ["en", "zh_CN"]  # the English book is _build/html, a translation _build/html/<language>


def page_of(chapter: str) -> str:
    return f"chapters/{chapter}.html"


def edition_root(language: str) -> Path:
    return HTML if language == "en" else HTML / language


def prefix_of(language: str) -> str:
    """The edition's folder in URLs, relative to the book's root."""
    return "" if language == "en" else f"{language}/"


def learner_path(chapter: str, language: str) -> Path:
    return ROOT / "chapters" / (f"{chapter}.ipynb" if language == "en" else f"{language}/{chapter}.ipynb")

LEAKS = [re.compile(p) for p in (rb"BEGIN SOLUTION", rb"END SOLUTION", rb"BEGIN HIDDEN TESTS",
                                 rb"END HIDDEN TESTS", rb"attn_probe", rb"import solutions\b",
                                 rb"from solutions(\.\w+)* import\b")]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-proxy-server", "--hide-scrollbars", "--window-size=1280,2400"]


@pytest.fixture(scope="session")
def book(tmp_path_factory) -> Path:
    """The built book, brought up to date once per test run (``run_once``: by the first worker that
    asks): built, or left as the last build that passed left it if nothing that build read has
    changed (after ``make book``, as the README runs it). Other modules that read the book import this."""
    return once(run_folder(tmp_path_factory), "book", lambda _: build_book())


def build_book() -> Path:
    """``python -m coursegen.book``, as ``make book`` runs it, with the launch buttons off."""
    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "COURSE_REPOSITORY_URL"}  # the buttons' off state
    proc = subprocess.run([sys.executable, "-m", "coursegen.book"], cwd=ROOT, capture_output=True,
                          text=True, timeout=2400, env=env)
    assert proc.returncode == 0, (f"`python -m coursegen.book` failed (exit {proc.returncode}); "
                                  f"warnings are errors.\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    print(f"book brought up to date in {time.perf_counter() - started:.1f} s: {proc.stdout.strip().splitlines()[-1]}")
    for language in EDITIONS:
        for chapter in CHAPTERS:
            assert (edition_root(language) / page_of(chapter)).is_file(), f"{language}: {chapter} not built"
    return HTML


def test_a_build_is_skipped_only_when_nothing_it_reads_has_changed(tmp_path, monkeypatch):
    """``python -m coursegen.book`` stops at once when the last build that passed read what a build
    would read now; a changed chapter, setting or launch-button repository builds again, and a
    changed test or built file does not."""
    from coursegen import book as coursebook
    project = tmp_path / "project"
    for folder in ("course", "tests", "_build/html/zh_CN"):
        (project / folder).mkdir(parents=True)
    (project / "course" / "01_a.py").write_text("x = 1\n")
    (project / "_config.yml").write_text("title: A\n")
    (project / "tests" / "test_a.py").write_text("def test(): pass\n")
    for index in (project / "_build/html/index.html", project / "_build/html/zh_CN/index.html"):
        index.write_text("<html></html>")
    monkeypatch.chdir(tmp_path)  # main() moves into the project; put back afterwards
    monkeypatch.delenv(coursebook.REPOSITORY_URL, raising=False)
    for name, value in {"ROOT": project, "BUILD": project / "_build", "HTML": project / "_build/html",
                        "BUILT_FROM": project / "_build/book.inputs"}.items():
        monkeypatch.setattr(coursebook, name, value)

    class Built(Exception):
        pass

    def build():
        raise Built()
    monkeypatch.setattr(coursebook, "chapters", build)  # the first step of a build
    coursebook.BUILT_FROM.write_text(coursebook.inputs_digest())
    assert coursebook.main([]) == 0
    (project / "tests" / "test_a.py").write_text("def test(): assert False\n")
    (project / "_build/html/index.html").write_text("<html>rebuilt</html>")
    assert coursebook.main([]) == 0
    with pytest.raises(Built):
        coursebook.main(["--force"])
    for change in (lambda: (project / "course" / "01_a.py").write_text("x = 2\n"),
                   lambda: (project / "_config.yml").write_text("title: B\n"),
                   lambda: monkeypatch.setenv(coursebook.REPOSITORY_URL, "https://github.com/a/b")):
        coursebook.BUILT_FROM.write_text(coursebook.inputs_digest())
        assert coursebook.main([]) == 0
        change()
        with pytest.raises(Built):
            coursebook.main([])
        assert not coursebook.BUILT_FROM.exists(), "a build under way must not look up to date"


@functools.cache
def parsed_page(path: Path) -> BeautifulSoup:
    """A page of the built book, parsed once per session (the book is built once and only read;
    a chapter page takes about half a second to parse, and several modules read each)."""
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _exercise_solutions(name: str) -> dict[str, str]:
    from coursegen import parse_chapter, strip_solution_markers
    chapter = parse_chapter(ROOT / "course" / f"{name}.py")
    return {c.name: strip_solution_markers(c.source) for c in chapter.of_kind("exercise")}


# --------------------------------------------------------------------------- static checks

def test_no_solution_or_hidden_test_text_anywhere(book):
    leaked = []
    for path in sorted(book.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            leaked += [f"{path.relative_to(book)}: {p.pattern.decode()}" for p in LEAKS if p.search(data)]
    assert not leaked, "solution or hidden-test text in the built book:\n" + "\n".join(leaked)


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_download_button_serves_the_learner_notebook(book, chapter, language):
    page = parsed_page(edition_root(language) / page_of(chapter))
    links = [a["href"] for a in page.select("a.btn-download-source-button")]
    assert links == [f"../_sources/chapters/{chapter}.ipynb"], f"download links: {links}"
    download = edition_root(language) / "_sources" / "chapters" / f"{chapter}.ipynb"
    assert download.read_bytes() == learner_path(chapter, language).read_bytes(), \
        f"the downloadable notebook is not byte for byte {learner_path(chapter, language).relative_to(ROOT)}"
    nb = nbformat.read(download, as_version=4)
    for number, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, \
                f"the downloadable notebook has outputs in cell {number}"


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_code_cells_on_the_page_are_the_learner_notebook(book, chapter, language):
    """Every code block shows the learner's source; exercise cells show only the stub."""
    nb = nbformat.read(learner_path(chapter, language), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", [])
            and "remove-input" not in c.metadata.get("tags", [])]
    cells = parsed_page(edition_root(language) / page_of(chapter)).select("article div.cell")
    assert len(cells) == len(code), f"{len(cells)} code cells on the page, {len(code)} in the notebook"

    solutions = _exercise_solutions(chapter)
    exercises = 0
    for number, (cell, html_cell) in enumerate(zip(code, cells), start=1):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        label = f"code cell {number}" + (f" ({grade_id})" if grade_id else "")
        pre = html_cell.select_one("div.cell_input pre")
        assert pre is not None, f"no source shown for {label}"
        shown = pre.get_text().rstrip()
        if not cell.metadata.get("nbgrader", {}).get("solution"):
            assert shown == cell.source.rstrip(), f"{label} on the page differs from the notebook"
            if cell.metadata.get("nbgrader", {}).get("grade"):   # a visible test: behind a toggle on the page
                assert "tag_hide-input" in html_cell.get("class", []), f"{label}: a test cell shown open"
            continue
        exercises += 1
        assert "raise NotImplementedError" in shown, f"exercise {grade_id} does not show the stub"
        assert html_cell.select_one("div.cell_output") is None, f"exercise {grade_id} shows an output"
        reference = solutions[grade_id]
        solution_only = set(re.findall(r"[A-Za-z_]\w*", reference)) - set(re.findall(r"[A-Za-z_]\w*", cell.source))
        assert solution_only, f"reference of {grade_id} has no identifier the stub lacks: check is vacuous"
        visible = solution_only & set(re.findall(r"[A-Za-z_]\w*", shown))
        assert not visible, f"exercise {grade_id} shows reference code: {sorted(visible)}"
        code_lines = {ln.strip() for ln in reference.splitlines() if ln.strip() and not ln.strip().startswith("#")}
        stub_lines = {ln.strip() for ln in cell.source.splitlines()}
        assert not (code_lines - stub_lines) & {ln.strip() for ln in shown.splitlines()}, \
            f"exercise {grade_id} shows lines of the reference solution"
        assert shown == cell.source.rstrip(), f"exercise {grade_id} on the page differs from its stub"
    assert exercises == len(solutions), f"{exercises} exercise cells on the page, {len(solutions)} exercises"


def _external(url: str | None) -> bool:
    return bool(url) and re.match(r"\s*(https?:)?//", url, re.I) is not None


def test_pages_load_nothing_from_the_network(book):
    """Scripts, styles, fonts and images come from the book itself; MathJax from _static."""
    bad = []
    for path in sorted(book.rglob("*.html")):
        if "_static" in path.relative_to(book).parts:
            continue
        page = parsed_page(path)
        rel = path.relative_to(book)
        for tag, attr in (("script", "src"), ("img", "src"), ("iframe", "src"), ("source", "src"),
                          ("video", "src"), ("audio", "src"), ("embed", "src"), ("object", "data")):
            bad += [f"{rel}: <{tag} {attr}={el[attr]}>" for el in page.find_all(tag) if _external(el.get(attr))]
        for link in page.find_all("link"):
            rels = {r.lower() for r in link.get("rel", [])}
            if rels & {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "shortcut",
                       "apple-touch-icon", "manifest", "preconnect", "dns-prefetch"} and _external(link.get("href")):
                bad.append(f"{rel}: <link rel={sorted(rels)} href={link['href']}>")
        for style in page.find_all("style"):
            bad += [f"{rel}: <style> {u}" for u in _css_external(style.get_text())]
        mathjax = [s["src"] for s in page.find_all("script") if "mathjax" in s.get("src", "").lower()]
        if page.select(".math"):
            assert mathjax, f"{rel} has math but loads no MathJax"
        for src in mathjax:
            target = (path.parent / src.split("?")[0]).resolve()
            assert "_static" in target.relative_to(book.resolve()).parts and target.is_file(), \
                f"{rel} loads MathJax from {src}, not from a file in _static"
    for css in sorted(book.rglob("*.css")):
        bad += [f"{css.relative_to(book)}: {u}" for u in _css_external(css.read_text(errors="replace"))]
    assert not bad, "pages need resources from the network:\n" + "\n".join(bad)


def _css_external(text: str) -> list[str]:
    urls = re.findall(r"url\(\s*['\"]?([^'\")]*)", text) + re.findall(r"@import\s+['\"]([^'\"]+)", text)
    return [u for u in urls if _external(u)]


# --------------------------------------------------------------------------- browser checks

@pytest.fixture(scope="module")
def chromium() -> str:
    return system_packages.chromium()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(folder: Path):
    """FOLDER served over HTTP on 127.0.0.1; yields its origin."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(book):
    with serving(book) as origin:
        yield origin


class DevTools:
    """A headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, binary: str, profile: Path):
        import websocket  # websocket-client
        profile.mkdir()
        # Chromium's singleton socket goes in $TMPDIR and stays there; a folder of its own, removed on
        # close, with a short path (a socket's path has at most 107 bytes: the profile's can be longer)
        self.tmp = tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": self.tmp})
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
        try:
            while not (port_file.is_file() and port_file.read_text().strip()):
                assert self.proc.poll() is None, f"chromium exited with {self.proc.returncode}"
                assert time.monotonic() < deadline, "chromium did not open its DevTools port in 60 s"
                time.sleep(0.1)
        except AssertionError:
            self._stop()
            raise
        port = int(port_file.read_text().split()[0])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        targets = json.loads(opener.open(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg["result"]
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        try:
            while not any(e["method"] == method for e in self.events):
                assert time.monotonic() < deadline, f"no {method} within {timeout} s"
                self.ws.settimeout(max(0.1, deadline - time.monotonic()))
                msg = json.loads(self.ws.recv())
                if "method" in msg:
                    self.events.append(msg)
        finally:
            self.ws.settimeout(60)

    def settle(self, seconds: float = 1.0) -> None:
        """Let the page run a little longer, then collect the events it sent meanwhile."""
        time.sleep(seconds)
        self.call("Runtime.evaluate", expression="0")

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True,
                           timeout=60000)
        assert "exceptionDetails" not in result, f"page script failed: {result['exceptionDetails']}"
        return result["result"].get("value")

    def close(self):
        try:
            self.ws.close()
        finally:
            self._stop()

    def _stop(self):
        """End Chromium and remove its TMPDIR."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def browser(chromium, tmp_path_factory):
    devtools = DevTools(chromium, tmp_path_factory.mktemp("chromium") / "profile")
    yield devtools
    devtools.close()


PAGE_REPORT = r"""
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  const article = document.querySelector("article.bd-article");
  const imgs = [...article.querySelectorAll("img")];
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
  const items = window.MathJax && MathJax.startup && MathJax.startup.document
      ? Array.from(MathJax.startup.document.math) : [];
  const mathErrors = items.map(m => [m.math, MathJax.startup.toMML(m.root)])
      .filter(([tex, mml]) => /<merror|mathcolor="red"/.test(mml)).map(([tex]) => tex);
  const prose = article.cloneNode(true);
  prose.querySelectorAll("div.cell, pre, code, mjx-container, script, style").forEach(e => e.remove());
  return {
    mathjax: window.MathJax && MathJax.version,
    mathjaxSrc: [...document.scripts].map(s => s.src).filter(s => /mathjax/i.test(s)),
    containers: article.querySelectorAll("mjx-container").length,
    mathNodes: article.querySelectorAll(".math").length,
    untypeset: [...article.querySelectorAll(".math")].filter(e => !e.querySelector("mjx-container"))
        .map(e => e.textContent.slice(0, 80)),
    errorNodes: document.querySelectorAll("mjx-merror, [data-mjx-error]").length,
    mathErrors: mathErrors,
    leftoverTex: (prose.textContent.match(/.{0,40}(\$|\\\(|\\\[).{0,40}/g) || []),
    images: imgs.map(i => ({src: i.currentSrc, width: i.naturalWidth, height: i.naturalHeight})),
  };
})()
"""


def _requests(devtools: DevTools, origin: str) -> tuple[list[str], list[str]]:
    """(URLs fetched outside the book's server, failed requests) since the last navigation."""
    urls = {e["params"]["requestId"]: e["params"]["request"]["url"]
            for e in devtools.events if e["method"] == "Network.requestWillBeSent"}
    outside = sorted({u for u in urls.values() if not u.startswith((origin + "/", "data:", "blob:", "about:"))})
    failed = [f"{urls.get(e['params']['requestId'])}: {e['params'].get('errorText')}"
              for e in devtools.events if e["method"] == "Network.loadingFailed"]
    failed += [f"{e['params']['response']['url']}: HTTP {e['params']['response']['status']}"
               for e in devtools.events if e["method"] == "Network.responseReceived"
               and e["params"]["response"]["status"] >= 400]
    return outside, [f for f in failed if "/favicon.ico" not in f]  # the browser asks for one itself


# Each page of both editions is opened once per run: the chapter checks below and axe-core
# (test_accessibility) read what it showed. A chapter page takes Chromium seconds of processor
# time to load and typeset.
AXE_SECONDS = 600
OWN = "article.bd-article, .course-edition-link"   # the course's own content on a page (test_accessibility)
AXE_RUN = r"""
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
  await new Promise(r => setTimeout(r, 400));     // the theme's tab stops on scrollable blocks (debounced 300 ms)
  const own = el => !!el && (el === document.documentElement || !!el.closest(OWN));
  const result = await axe.run(document, {resultTypes: ["violations"]});
  return result.violations.flatMap(v => v.nodes.map(n => ({
    rule: v.id, impact: n.impact || v.impact, help: v.help,
    target: n.target.join(" "), html: n.html.slice(0, 160),
    own: own(document.querySelector(n.target[n.target.length - 1])),
  })));
})()
"""


def site_pages() -> list[str]:
    """Every page of both editions (as URL paths), whatever the chapters are."""
    from coursegen.linkcheck import pages
    return [p.relative_to(HTML).as_posix() for p in pages(HTML)
            if 'http-equiv="Refresh"' not in p.read_text(encoding="utf-8")[:200]]  # index.html: a redirect


def _visit(browser: DevTools, origin: str, page: str, axe_source: str) -> dict:
    """What one page showed: on a chapter page, its report (PAGE_REPORT), script errors, requests
    and a screenshot (``_build/screenshots``); on every page, axe-core's violations."""
    browser.open(f"{origin}/{page}")
    seen = {}
    language = next((lang for lang in EDITIONS if lang != "en" and page.startswith(prefix_of(lang))), "en")
    if page.startswith(f"{prefix_of(language)}chapters/"):
        seen["report"] = browser.evaluate(PAGE_REPORT)
        browser.settle()
        seen["exceptions"] = [e["params"]["exceptionDetails"].get("exception", {}).get("description", "")
                              or e["params"]["exceptionDetails"].get("text", "")
                              for e in browser.events if e["method"] == "Runtime.exceptionThrown"]
        shot = browser.call("Page.captureScreenshot", format="png")
        screenshot = ROOT / "_build" / "screenshots" / f"{Path(page).stem}.{language}.png"
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        seen["outside"], seen["failed"] = _requests(browser, origin)
    browser.ws.settimeout(AXE_SECONDS)  # a long chapter takes axe-core a minute on a busy machine
    try:
        browser.call("Runtime.evaluate", expression=axe_source + ";0")
        result = browser.call("Runtime.evaluate", expression=AXE_RUN.replace("OWN", repr(OWN)),
                              awaitPromise=True, returnByValue=True)
    finally:
        browser.ws.settimeout(60)
    assert "exceptionDetails" not in result, f"{page}: axe-core failed: {result['exceptionDetails']}"
    seen["violations"] = result["result"]["value"]
    return seen


def visit_pages(book: Path, tmp: Path) -> dict:
    """Every page of the built book, visited in one headless Chromium per core (axe-core runs on one
    thread of a page): {"origin": the server's, "pages": page -> ``_visit``'s record}."""
    from npm_packages import npm_package
    axe_source = (npm_package("axe-core") / "axe.min.js").read_text()
    binary = system_packages.chromium()
    pages, started = site_pages(), time.perf_counter()
    work, seen, seconds = queue.SimpleQueue(), {}, {}
    for page in pages:
        work.put(page)

    def worker(origin: str, profile: Path) -> None:
        browser = DevTools(binary, profile)
        try:
            while True:
                try:
                    page = work.get_nowait()
                except queue.Empty:
                    return
                begun = time.perf_counter()
                seen[page] = _visit(browser, origin, page, axe_source)
                seconds[page] = time.perf_counter() - begun
        except BaseException:
            with contextlib.suppress(queue.Empty):  # the other browsers stop after their current page
                while True:
                    work.get_nowait()
            raise
        finally:
            browser.close()

    browsers = min(os.cpu_count() or 1, 4)  # each Chromium holds a few hundred MB
    with serving(book) as origin, concurrent.futures.ThreadPoolExecutor(browsers) as pool:
        list(pool.map(worker, [origin] * browsers, [tmp / f"chromium-{i}" for i in range(browsers)]))
    slowest = max(seconds, key=seconds.get)
    print(f"{len(pages)} pages visited in {time.perf_counter() - started:.1f} s with {browsers} browsers "
          f"(slowest: {slowest}, {seconds[slowest]:.1f} s)")
    return {"origin": origin, "pages": {page: seen[page] for page in pages}}


@pytest.fixture(scope="session")
def page_visits(book, tmp_path_factory) -> dict:
    """Every page of both editions visited once per test run (``visit_pages``; by the first worker
    that asks)."""
    return once(run_folder(tmp_path_factory), "page-visits", lambda tmp: visit_pages(book, tmp))


def test_the_instructor_page_includes_the_readme_sections(book):
    page = parsed_page(book / "instructors.html").get_text()
    for words in ("Grading a whole class", "grade-class", "What is public and what is private"):
        assert words in page, f"the instructor page lacks {words!r}"


@pytest.mark.parametrize("page", ["intro.html", "instructors.html", "search.html", "genindex.html"])
def test_other_pages_load_offline(browser, server, page):
    browser.open(f"{server}/{page}")
    browser.settle()
    outside, failed = _requests(browser, server)
    assert not outside, f"{page} fetched from outside the book: {outside}"
    assert not failed, f"{page} failed to load: {failed}"


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_page_renders_math_and_figures_offline(page_visits, chapter, language):
    """MathJax from the book typesets every formula, every figure loads from the book, nothing is
    fetched from outside and no script fails (a screenshot of each is in _build/screenshots)."""
    edition = f"{page_visits['origin']}/{prefix_of(language)}"
    seen = page_visits["pages"][f"{prefix_of(language)}{page_of(chapter)}"]
    report = seen["report"]
    assert report["mathjax"] and report["mathjax"].startswith("3."), f"MathJax did not load: {report['mathjax']}"
    assert [s.split("?")[0] for s in report["mathjaxSrc"]] == [f"{edition}_static/mathjax/tex-chtml.js"], \
        f"MathJax is not loaded from the book's _static: {report['mathjaxSrc']}"
    assert report["mathNodes"] >= MIN_MATH and report["containers"] >= report["mathNodes"], \
        f"{report['containers']} typeset formulas for {report['mathNodes']} math nodes"
    assert not report["untypeset"], f"math left untypeset: {report['untypeset'][:5]}"
    assert report["errorNodes"] == 0 and not report["mathErrors"], f"MathJax errors in: {report['mathErrors']}"
    assert not report["leftoverTex"], f"TeX delimiters left in the prose: {report['leftoverTex'][:5]}"

    images = report["images"]
    assert len(images) >= MIN_FIGURES, f"only {len(images)} figures on the page"
    broken = [i["src"] for i in images if i["width"] <= 0 or i["height"] <= 0]
    assert not broken, f"figures that did not load: {broken}"
    for image in images:
        assert image["src"].startswith(f"{edition}_images/"), image["src"]
        data = (HTML / image["src"][len(page_visits["origin"]) + 1:]).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), f"{image['src']} is not a PNG"

    assert not seen["outside"], f"the chapter page fetched from outside the book: {seen['outside']}"
    assert not seen["failed"], f"requests of the chapter page failed: {seen['failed']}"
    assert not seen["exceptions"], f"JavaScript errors on the chapter page: {seen['exceptions']}"


# --------------------------------------------------------------------------- the Chinese edition

FONT_PROBE = "article.bd-article section > p:not(.course-edition-link)"


def _fonts_drawing(browser: DevTools, selector: str) -> list[dict]:
    """The platform fonts Chromium used to draw the first element SELECTOR matches (name, glyphs)."""
    browser.call("DOM.enable")
    browser.call("CSS.enable")
    document = browser.call("DOM.getDocument", depth=1)["root"]["nodeId"]
    node = browser.call("DOM.querySelector", nodeId=document, selector=selector)["nodeId"]
    assert node, f"nothing on the page matches {selector}"
    return browser.call("CSS.getPlatformFontsForNode", nodeId=node)["fonts"]


@pytest.mark.parametrize("page", ["intro.html", *(page_of(c) for c in CHAPTERS)])
def test_chinese_pages_draw_cjk_glyphs_from_a_real_font(browser, server, page):
    """The prose is Chinese, and Chromium draws its glyphs from a CJK font (not a fallback box)."""
    browser.open(f"{server}/zh_CN/{page}")
    browser.evaluate("document.fonts.ready.then(() => 0)")
    text = browser.evaluate(f"document.querySelector('{FONT_PROBE}').textContent")
    han = re.findall(r"[\u4e00-\u9fff]", text)
    assert len(han) >= 10, f"{page}: the first paragraph is not Chinese: {text[:80]!r}"
    fonts = _fonts_drawing(browser, FONT_PROBE)
    cjk = sum(f["glyphCount"] for f in fonts if re.search(r"CJK|Hei|Song|Ming|WenQuanYi", f["familyName"]))
    assert cjk >= len(han), f"{page}: {len(han)} Chinese characters, {cjk} drawn by a CJK font: {fonts}"
    lang = browser.evaluate("document.documentElement.lang")
    assert lang.lower().startswith("zh"), f"{page}: <html lang={lang!r}>"


def test_chinese_pages_use_the_themes_chinese_words(book):
    page = parsed_page(book / "zh_CN" / page_of(CHAPTERS[0]))
    words = page.get_text(" ")
    assert "搜索" in words, "the theme's search box is not in Chinese"
    assert re.search(r"上一[页个篇]|下一[页个篇]", words), "previous/next links are not in Chinese"


@pytest.mark.parametrize("language", EDITIONS)
@pytest.mark.parametrize("page", ["intro.html", "glossary.html", "instructors.html", *(page_of(c) for c in CHAPTERS)])
def test_every_page_links_to_the_same_page_in_the_other_edition(book, page, language):
    path = edition_root(language) / page
    links = parsed_page(path).select("p.course-edition-link a")
    assert len(links) == 1, f"{language}/{page}: {len(links)} links to the other edition"
    target = (path.parent / links[0]["href"]).resolve()
    other = edition_root("zh_CN" if language == "en" else "en") / page
    assert target == other.resolve() and other.is_file(), f"{language}/{page} links to {links[0]['href']}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chinese_figures_are_drawn_in_chinese_with_every_glyph(book, chapter):
    """Figure text comes from the catalog, and matplotlib found a glyph for every character.

    (matplotlib warns and draws a box when a font lacks one.)
    """
    staged = nbformat.read(ROOT / "_build" / "src.zh_CN" / "chapters" / f"{chapter}.ipynb", as_version=4)
    figures = [c for c in staged.cells if c.cell_type == "code"
               and any("image/png" in o.get("data", {}) for o in c.get("outputs", []))]
    assert figures, f"{chapter}: no figures in the Chinese edition"
    assert any(re.search(r"[\u4e00-\u9fff]", c.source) for c in figures), \
        f"{chapter}: no figure of the Chinese edition is drawn with Chinese text"
    shown = "\n".join(o.get("text", "") for c in staged.cells if c.cell_type == "code" for o in c.get("outputs", []))
    # text: "Glyph ... missing from font"; text around $math$: "Font ... does not have a glyph"
    missing = re.findall(r".*(?:missing from (?:current )?font|does not have a glyph).*", shown)
    assert not missing, f"{chapter}: glyphs missing from the figure font: {missing[:3]}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chinese_prose_quotes_the_english_editions_numbers(book, chapter):
    """Numbers glued into the prose are the same in both editions, timings included."""
    from coursegen.book import glued_outputs

    def numbers(folder):
        nb = nbformat.read(ROOT / "_build" / folder / "chapters" / f"{chapter}.ipynb", as_version=4)
        return {name: out["data"] for name, out in glued_outputs(nb).items()}
    english, chinese = numbers("src"), numbers("src.zh_CN")
    assert english.keys() == chinese.keys(), f"{chapter}: the editions glue different names"
    differ = [name for name in english if json.dumps(chinese[name], ensure_ascii=False).isascii()
              and chinese[name] != english[name]]
    assert not differ, f"{chapter}: the Chinese prose quotes other numbers for {differ}"
