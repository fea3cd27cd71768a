"""``python -m coursegen.book``: build both editions of the Jupyter Book into ``_build/html``.

Each chapter is executed once, for both editions, with the reference solution standing in
for its stubs (``run_chapter``, cached by content hash): the English notebook's code, rewritten
so that it prints and draws in the translation too (``coursegen.bilingual_run``). Every number
either edition's page shows or glues comes from that one run. Its outputs are then copied onto
each edition's learner notebook, so the book shows figures made by the reference while every
exercise cell shows only its stub. The page's download button serves the plain learner notebook.
The learner notebook's MyST is rendered plain (``coursegen.learner_view``): the page takes its
markdown, and the run its given code (myst_nb's ``glue``), from the instructor notebook.

The English edition is ``_build/html``; each translation is ``_build/html/<language>``,
built from its own learner notebooks (made from the catalogs, see ``coursegen.catalogs``)
with Sphinx's ``language`` set, so the theme speaks it too. Every page links to the same
page in the other edition (``coursegen.language_switch``). A translation's figures are drawn
with its font first (``coursekit.conventions.FIGURE_FONTS``); ``make fonts`` installs one
(Noto Sans CJK), and a figure drawn without a glyph it needs fails the build.

A build that passes records what it read (``inputs_digest``); run again with nothing of that
changed, it says so and stops, as make would (``--force`` builds anyway).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.metadata
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

import yaml

from coursekit import conventions as C
from coursekit.conventions import EDITIONS, SOURCE_LANGUAGE, TRANSLATIONS, is_test_cell, with_python_bin_on_path

from . import ROOT, bilingual_run, chapters, strip_solution_markers
from .catalogs import FRONT_MATTER, translations
from .figure_alt import with_figure_alt_text
from .front_matter import translated_page
from .learner_view import with_book_sources

BUILD = ROOT / "_build"
STAGE = BUILD / "src"
EXEC_CACHE = BUILD / "executed"
HTML = BUILD / "html"
BUILT_FROM = BUILD / "book.inputs"  # ``inputs_digest()`` of the last build that passed
NOT_READ = {".git", ".venv", "_build", ".cache", ".pytest_cache", "__pycache__", ".ipynb_checkpoints",
            "tests", "benchmarks", ".ci", ".github"}  # folders no build reads (at any depth)
BOOK_PAGES = ("intro.md", "start_here.md", "glossary.md", "instructors.md", "README.md")  # README: included by instructors.md
BOOK_DATA = ("_toc.yml", "locales/glossary.csv")  # and every image the pages show (page_images)
# The words of the link to the other edition, in that edition's language.
EDITION_NAMES = {SOURCE_LANGUAGE: "English", "zh_CN": "中文"}
# The course's public repository (e.g. https://github.com/ORG/REPO), set by the deploying workflow:
# it turns on the repository, Colab and Binder buttons. Without it they stay off.
REPOSITORY_URL = "COURSE_REPOSITORY_URL"
REPOSITORY_BRANCH = "main"
BOOK_JOBS = "COURSE_BOOK_JOBS"  # how many chapters execute at once (default: one per core)
LAUNCH_SERVICES = {"binderhub_url": "https://mybinder.org", "colab_url": "https://colab.research.google.com"}
LEAK = re.compile(r"BEGIN (SOLUTION|HIDDEN TESTS)|END (SOLUTION|HIDDEN TESTS)|attn_probe|"
                  r"^\s*(from|import) solutions\b", re.M)
# The translated edition's cells record every string their figures draw (titles, labels, tick
# labels, legends, annotations, table cells), as cell metadata of the cached notebook: tests read
# it for English left in the translation without running the chapter again.
FIGURE_TEXT = "figure_text"
RUN_RECORD = ".bilingual_run.json"


def run_key(chapter) -> str:
    """What the chapter's run depends on: both editions' learner and instructor notebooks, the solutions."""
    solutions = {c.name: strip_solution_markers(c.source) for c in chapter.of_kind("exercise")}
    digest = hashlib.sha256(repr(sorted(solutions.items())).encode())
    for language in EDITIONS:
        digest.update(C.learner_notebook(chapter.name, language).read_bytes())
        digest.update(C.instructor_notebook(chapter.name, language).read_bytes())
    digest.update(bilingual_run.KERNEL_MODULE.read_bytes() + Path(bilingual_run.__file__).read_bytes())
    return digest.hexdigest()[:16]


def cached_run(chapter, language: str = SOURCE_LANGUAGE, key: str | None = None) -> Path:
    prefix = chapter.name if language == SOURCE_LANGUAGE else f"{chapter.name}.{language}"
    return EXEC_CACHE / f"{prefix}-{key or run_key(chapter)}.ipynb"


def executed_chapter(chapter, language: str = SOURCE_LANGUAGE) -> nbformat.NotebookNode:
    """The learner notebook of LANGUAGE with the outputs of the chapter's one run (cached by content)."""
    if not cached_run(chapter, language).exists():
        run_chapter(chapter)
    return nbformat.read(cached_run(chapter, language), as_version=4)


def _book_run(chapter, learner, language: str, solutions: dict) -> nbformat.NotebookNode:
    """The notebook the book executes: the learner notebook with the solutions in its stubs.

    The learner notebook's glue prints; the book's run glues (the instructor notebook's given code).
    """
    run = with_book_sources(nbformat.from_dict(learner), instructor_of(chapter, language), "code")
    for cell in run.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in solutions:
            cell.source = solutions[grade_id]
    return run


def stderr_shown(nb) -> list[tuple[int, str]]:
    """(cell number, first line) of each cell's output to stderr: a page must show none."""
    return [(number, output["text"].strip().splitlines()[0]) for number, cell in enumerate(nb.cells)
            if cell.cell_type == "code" for output in cell.outputs
            if output.get("output_type") == "stream" and output.get("name") == "stderr" and output["text"].strip()]


def run_chapter(chapter) -> None:
    """Execute the chapter once and cache its learner notebook of every edition with the run's outputs.

    The English run's code is rewritten (``bilingual_run``) so that it prints and draws for the
    translation too: every number on either page comes from this one run.
    """
    key = run_key(chapter)  # of what is read now: a file changed during the run makes a new key
    learners = {language: nbformat.read(C.learner_notebook(chapter.name, language), as_version=4)
                for language in EDITIONS}
    solutions = {c.name: strip_solution_markers(c.source) for c in chapter.of_kind("exercise")}
    runs = {language: _book_run(chapter, learners[language], language, solutions) for language in EDITIONS}
    run = runs[SOURCE_LANGUAGE]
    for language in TRANSLATIONS:
        if [c.cell_type for c in runs[language].cells] != [c.cell_type for c in run.cells]:
            raise SystemExit(f"{chapter.name}: the {language} notebook's cells are not the English notebook's")
    (translation,) = TRANSLATIONS  # the rewrite carries one translation
    for cell, other in zip(run.cells, runs[translation].cells):
        if cell.cell_type == "code":
            cell.source = bilingual_run.run_source(cell.source, other.source)
    require_figure_font(translation)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"exec-{chapter.name}-") as cwd, \
            tempfile.TemporaryDirectory(prefix="kernel-") as sockets:  # files a chapter writes; the kernel's
        record_file = str(Path(cwd) / RUN_RECORD)
        run.cells.insert(0, nbformat.v4.new_code_cell(
            bilingual_run.prelude(list(C.FIGURE_FONTS.get(translation, ())), record_file)))
        # Sockets as files: nothing listens on TCP (nor warns about it in the build's log).
        # Its connection file there too: jupyter_client would leave one in /tmp for each chapter run.
        kernel = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=f"{sockets}/kernel",
                                    connection_file=f"{sockets}/connection.json")
        run.cells.append(nbformat.v4.new_code_cell("_bilingual._dump()"))  # the strings of the cells after the last figure
        # cleanup_kc: a client given its kernel manager leaves the kernel running (nbclient's default)
        NotebookClient(run, km=kernel, timeout=600, resources={"metadata": {"path": cwd}},
                       allow_errors=False).execute(cleanup_kc=True)
        record = json.loads(Path(record_file).read_text())
    run.cells = run.cells[1:-1]
    print(f"executed {chapter.name} with the reference in {time.perf_counter() - started:.1f} s (both editions)")
    stderr = stderr_shown(run)
    if stderr:  # a warning on a page is a defect of the chapter, never what a reader should see
        number, line = stderr[0]
        raise SystemExit(f"{chapter.name}: cell {number} writes to stderr, which its page would show: {line}")
    if record["problems"]:
        raise SystemExit(f"{chapter.name}: a figure was drawn without the glyphs it needs: "
                         + "; ".join(record["problems"][:3]) + " (run `make fonts`)")
    translator = bilingual_run.Translator(record)
    EXEC_CACHE.mkdir(parents=True, exist_ok=True)
    for language, learner in learners.items():
        for cell, done in zip(learner.cells, run.cells):
            if cell.cell_type != "code":
                continue
            cell.execution_count = None
            if cell.metadata.get("nbgrader", {}).get("solution"):
                cell.outputs = []
            elif language == SOURCE_LANGUAGE:
                cell.outputs = done.outputs
            else:
                translated = [translator.output(o) for o in done.outputs]
                cell.outputs = [output for output, _ in translated]
                figures = [drawn for _, drawn in translated if drawn is not None]
                if figures:
                    cell.metadata[FIGURE_TEXT] = figures
        if language != SOURCE_LANGUAGE:
            learner.metadata[FIGURE_TEXT] = True
        stale = cached_run(chapter, language, key).name.rsplit("-", 1)[0]
        for old in EXEC_CACHE.glob(f"{stale}-*.ipynb"):
            old.unlink()
        nbformat.write(learner, cached_run(chapter, language, key))


def instructor_of(chapter, language: str) -> nbformat.NotebookNode:
    return nbformat.read(C.instructor_notebook(chapter.name, language), as_version=4)


def _execute(name: str) -> None:
    """Run one chapter into the cache (a worker of ``execute_all``)."""
    run_chapter(next(c for c in chapters() if c.name == name))


def execute_all(found, jobs: int) -> None:
    """Fill the executed-notebook cache for every chapter not cached yet, JOBS kernels at a time.

    Every chapter runs torch on one thread, so two kernels on two cores take about half the time
    of one after the other; the longest chapters (by source size) start first.
    """
    todo = sorted((c.name for c in found if not all(cached_run(c, language).exists() for language in EDITIONS)),
                  key=lambda name: -(C.COURSE_DIR / f"{name}.py").stat().st_size)
    if jobs <= 1 or len(todo) <= 1:
        for name in todo:
            _execute(name)
        return
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        for future in [pool.submit(_execute, name) for name in todo]:
            future.result()


def with_tests_collapsed(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """On the page, visible tests sit behind a toggle so the prose leads; the notebook keeps them open."""
    for cell in nb.cells:
        if cell.cell_type == "code" and is_test_cell(cell):
            tags = cell.metadata.setdefault("tags", [])
            if "hide-input" not in tags:
                tags.append("hide-input")
    return nb


def glued_outputs(nb: nbformat.NotebookNode) -> dict[str, dict]:
    """The outputs of myst_nb's glue() calls, by name: the numbers the prose quotes."""
    return {output.metadata["scrapbook"]["name"]: output
            for cell in nb.cells if cell.cell_type == "code"
            for output in cell.outputs if "scrapbook" in output.get("metadata", {})}


def require_figure_font(language: str) -> None:
    """A translated edition's figures need one of its fonts here; say so in one line if none is."""
    fonts = C.FIGURE_FONTS.get(language)
    if not fonts:
        return
    from matplotlib import font_manager
    if not set(fonts) & {f.name for f in font_manager.fontManager.ttflist}:
        # matplotlib keeps a font list from before the font was installed: read the fonts again.
        font_manager.fontManager = font_manager._load_fontmanager(try_read_cache=False)
        if not set(fonts) & {f.name for f in font_manager.fontManager.ttflist}:
            raise SystemExit(f"the {language} edition's figures need one of the fonts {', '.join(fonts)}: "
                             "run `make fonts` (Debian/Ubuntu: apt-get install fonts-noto-cjk)")


def stage_of(language: str) -> Path:
    return STAGE if language == SOURCE_LANGUAGE else BUILD / f"src.{language}"


def html_of(language: str) -> Path:
    return HTML if language == SOURCE_LANGUAGE else HTML / language


def page_images() -> list[str]:
    """The files of the pages' Markdown images (``![...](docs/images/x.png)``), so a new one is never left out."""
    return sorted({m for name in BOOK_PAGES
                   for m in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (ROOT / name).read_text())
                   if not m.startswith(("http:", "https:", "data:"))})


def stage(found, language: str = SOURCE_LANGUAGE) -> Path:
    """The book's source for one edition: pages, executed notebooks and its _config.yml."""
    folder = stage_of(language)
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "chapters").mkdir(parents=True)
    for name in (*BOOK_DATA, *page_images()):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, folder / name)
    lookup = None if language == SOURCE_LANGUAGE else translations(FRONT_MATTER, language).get
    for name in BOOK_PAGES:
        text = (ROOT / name).read_text() if lookup is None else translated_page(name, lookup)
        (folder / name).write_text(text)
    (folder / "_config.yml").write_text(edition_config(language, lookup))
    for chapter in found:
        nb = with_figure_alt_text(with_tests_collapsed(executed_chapter(chapter, language)), language)
        # The page reads the MyST the learner notebook renders plain (``coursegen.learner_view``).
        nb = with_book_sources(nb, instructor_of(chapter, language), "markdown")
        nbformat.write(nb, folder / "chapters" / f"{chapter.name}.ipynb")
    return folder


def edition_config(language: str, lookup) -> str:
    """_config.yml with the edition's language, title and link to the other edition."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    sphinx = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx["language"] = "en" if language == SOURCE_LANGUAGE else language
    sphinx["extensions"] = [*sphinx["extensions"], "coursegen.language_switch", "coursegen.accessible_pages"]
    other = TRANSLATIONS[0] if language == SOURCE_LANGUAGE else SOURCE_LANGUAGE
    sphinx["course_edition"] = {
        "other_root": f"{other}/" if language == SOURCE_LANGUAGE else "../",
        "other_name": EDITION_NAMES[other],
        "other_lang": other.replace("_", "-"),
    }
    if lookup is not None:
        title = lookup(f"# {config['title']}")  # the front page's heading, without its glossary note
        config["title"] = re.sub(r"（[^）]*）", "", title[2:]) if title else config["title"]
        config["author"] = lookup(config["author"]) or config["author"]  # the footer of every page
    with_launch_buttons(config, language)
    return yaml.safe_dump(config, allow_unicode=True, sort_keys=False)


def with_launch_buttons(config: dict, language: str) -> dict:
    """CONFIG with the repository, Colab and Binder buttons when $COURSE_REPOSITORY_URL names the repository.

    They open the edition's learner notebook (``coursegen.launch_buttons``); Binder installs
    binder/requirements.txt.
    """
    url = os.environ.get(REPOSITORY_URL, "").strip().rstrip("/")
    if not url:
        return config
    config["repository"] = {"url": url, "branch": REPOSITORY_BRANCH, "path_to_book": ""}
    config.setdefault("html", {})["use_repository_button"] = True
    config.setdefault("launch_buttons", {}).update(LAUNCH_SERVICES)
    sphinx = config["sphinx"]["config"]
    sphinx["extensions"] = [*sphinx["extensions"], "coursegen.launch_buttons"]
    sphinx["course_notebook_folder"] = C.learner_notebook("any", language).parent.relative_to(ROOT).as_posix()
    return config


def sphinx_output(language: str) -> Path:
    """Where an edition's Sphinx build writes (``_build/html`` under it): the translation's apart."""
    return ROOT if language == SOURCE_LANGUAGE else BUILD / language


def build(language: str = SOURCE_LANGUAGE) -> None:
    env = with_python_bin_on_path()
    env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # the extension
    output = sphinx_output(language)
    cmd = [str(Path(sys.executable).parent / "jupyter-book"), "build", str(stage_of(language)),
           "--path-output", str(output), "--warningiserror", "--keep-going", "--quiet"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"jupyter-book build of the {language} edition failed (exit {proc.returncode})")


def place(language: str) -> None:
    """A translation's pages into ``_build/html/<language>``, once the English build (which empties
    ``_build/html``) has finished."""
    if language != SOURCE_LANGUAGE:
        shutil.rmtree(html_of(language), ignore_errors=True)
        shutil.copytree(sphinx_output(language) / "_build" / "html", html_of(language))


def publish_learner_notebooks(found, language: str = SOURCE_LANGUAGE) -> None:
    """The download button serves _sources/...: make that the learner notebook itself."""
    for chapter in found:
        target = html_of(language) / "_sources" / "chapters" / f"{chapter.name}.ipynb"
        if target.exists():
            shutil.copyfile(C.learner_notebook(chapter.name, language), target)


def leaks(html_dir: Path) -> list[str]:
    found = []
    for path in html_dir.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".ipynb", ".txt", ".md", ".py", ".js", ".json"):
            if "_static" in path.parts and path.suffix == ".js":
                continue
            if LEAK.search(path.read_text(errors="replace")):
                found.append(str(path.relative_to(html_dir)))
    return found


def inputs_digest() -> str:
    """What a build reads, hashed: every file of the project but the tests, the benchmarks and what
    is built or installed; this Python and the version of every installed package; the launch
    buttons' repository."""
    digest = hashlib.sha256()
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = sorted(d for d in subfolders if d not in NOT_READ)
        for name in sorted(files):
            path = Path(folder, name)
            if path.is_file():
                digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    versions = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    digest.update("\n".join([sys.version, os.environ.get(REPOSITORY_URL, ""), *versions]).encode())
    return digest.hexdigest()


def up_to_date(digest: str) -> bool:
    """Whether the built book is what a build would make now: built by a build that passed, from
    what a build would read now."""
    return BUILT_FROM.is_file() and BUILT_FROM.read_text() == digest and \
        all((html_of(language) / "index.html").is_file() for language in EDITIONS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursegen.book", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="build even if nothing the book reads has changed")
    force = parser.parse_args(argv).force
    os.chdir(ROOT)
    digest = inputs_digest()
    if not force and up_to_date(digest):
        print(f"the book in {HTML.relative_to(ROOT)} is up to date: nothing it reads has changed since it was built "
              "(--force builds it again)")
        return 0
    BUILT_FROM.unlink(missing_ok=True)
    found = chapters()
    execute_all(found, int(os.environ.get(BOOK_JOBS) or os.cpu_count() or 1))
    for language in EDITIONS:
        stage(found, language)

    def built(language: str) -> float:
        started = time.perf_counter()
        build(language)
        return time.perf_counter() - started
    # The editions' Sphinx builds share nothing and each keeps one core busy: they run at once.
    with concurrent.futures.ThreadPoolExecutor(len(EDITIONS)) as pool:
        seconds = dict(zip(EDITIONS, pool.map(built, EDITIONS)))
    for language in EDITIONS:  # English first: its build empties _build/html
        place(language)
        publish_learner_notebooks(found, language)
        print(f"{language} edition built in {seconds[language]:.1f} s: {html_of(language) / 'index.html'}")
    bad = leaks(HTML)
    if bad:
        print("the built book holds solution or hidden-test text: " + ", ".join(bad), file=sys.stderr)
        return 1
    BUILT_FROM.write_text(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
