"""Every chapter has everything ARCHITECTURE.md's "Where a new chapter plugs in" lists.

One test per item, in the checklist's order, for each chapter of ``coursekit.conventions.chapter_names()``
(one per ``course/NN_name.py``): a chapter that lacks an item fails with what to add and where.
Each item is a function ``missing_...(chapter) -> list[str]`` (empty when nothing is missing), so that
``test_each_check_finds_what_a_chapter_without_files_lacks`` can run every check on a chapter that has
nothing and see each message fire.
"""
from __future__ import annotations

import ast
import json
import re

import pytest
import yaml

from support import DEFAULT_MODULE_SECONDS, ROOT

from autograder.judge.verdict import ATTENTION_BUILTINS, BUILTIN_MODULES
from coursegen import catalogs
from coursegen.front_matter import front_matter_units
from coursekit import conventions as C

SHARED_SPEC = ROOT.parent / "shared" / "COURSE_SPEC.md"
PROPOSED_SPECS = ROOT / "docs" / "spec"
TESTS = ROOT / "tests"
FORBIDDEN_BUILTINS = set(ATTENTION_BUILTINS) | BUILTIN_MODULES  # names the grader refuses in a from-scratch exercise
READING_TIME = "time estimate for the reader (opening)"  # TYPED's reason for the opening's estimate


def number(chapter: str) -> int:
    return int(chapter[:2])


def missing_source(chapter: str) -> list[str]:
    path = C.COURSE_DIR / f"{chapter}.py"
    return [] if path.exists() else [f"chapter {chapter}: write its source course/{chapter}.py (course/README.md)"]


def missing_generated_files(chapter: str) -> list[str]:
    wanted = [C.instructor_notebook(chapter, language) for language in C.EDITIONS]
    wanted += [C.learner_notebook(chapter, language) for language in C.EDITIONS]
    wanted += [ROOT / f"{C.reference_module(chapter).replace('.', '/')}.py",
               ROOT / f"{C.hidden_module(chapter).replace('.', '/')}.py"]
    return [f"chapter {chapter}: {path.relative_to(ROOT)} is missing: run `make generate`"
            for path in wanted if not path.exists()]


def missing_toc_entry(chapter: str) -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [entry.get("file") for entry in toc.get("chapters", [])]
    if f"chapters/{chapter}" in files:
        return []
    return [f"chapter {chapter}: add `- file: chapters/{chapter}` to _toc.yml's chapters, after the chapter "
            "before it (both editions' books are staged from this one _toc.yml)"]


def _untranslated_front_matter(chapter: str, row: str, page: str) -> list[str]:
    """Each front-matter unit of PAGE holding ROW, in every translation's front_matter.po."""
    units = [(text, where) for text, where in front_matter_units() if where.startswith(f"{page}:") and row in text]
    found = []
    for language in C.TRANSLATIONS:
        done = catalogs.translations(catalogs.FRONT_MATTER, language)
        po = catalogs.po_path(catalogs.FRONT_MATTER, language).relative_to(ROOT)
        found += [f"chapter {chapter}: translate the entry of {where} that holds its row in {po} (run "
                  "`python -m coursegen.catalogs update`, then fill its msgstr)" for text, where in units if text not in done]
    return found


def missing_intro_row(chapter: str) -> list[str]:
    link = f"](chapters/{chapter}.ipynb)"
    rows = [line for line in (ROOT / "intro.md").read_text().splitlines() if line.startswith("|") and link in line]
    if not rows:
        return [f"chapter {chapter}: add a row `| [{number(chapter)}. Title]({link[2:-1]}) | you build | you measure "
                "or see |` to intro.md's chapter table"]
    return _untranslated_front_matter(chapter, rows[0], "intro.md")


def missing_readme_row(chapter: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| chapter | status |"):].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith(f"| {number(chapter)}. ")]
    if not rows:
        return [f"chapter {chapter}: add a row `| {number(chapter)}. Title | **available** |` to README.md's "
                "chapter table (| chapter | status |)"]
    return _untranslated_front_matter(chapter, rows[0], "README.md")


def missing_spec(chapter: str) -> list[str]:
    heading = re.compile(rf"^### {chapter}\b", re.M)
    proposed = PROPOSED_SPECS / f"{chapter}.md"
    if proposed.exists() and heading.search(proposed.read_text()):
        return []
    if SHARED_SPEC.exists() and heading.search(SHARED_SPEC.read_text()):
        return []
    return [f"chapter {chapter}: write its exercise table as docs/spec/{chapter}.md (a `### {chapter} — ...` "
            "section in the style of ../shared/COURSE_SPEC.md) until the shared spec takes it"]


def missing_translation(chapter: str) -> list[str]:
    found = []
    for language in C.TRANSLATIONS:
        po = catalogs.po_path(f"chapters/{chapter}", language)
        if not po.exists():
            found.append(f"chapter {chapter}: {po.relative_to(ROOT)} is missing: run `python -m coursegen.catalogs "
                         "update`, then translate every entry")
        elif (C.COURSE_DIR / f"{chapter}.py").exists():
            found += [f"chapter {chapter}: {problem}" for problem in catalogs.problems(f"chapters/{chapter}", language)]
    return found


def missing_typed_numbers(chapter: str) -> list[str]:
    from test_prose_numbers import CHAPTERS, TYPED, typed_measurements
    where = "TYPED in tests/test_prose_numbers.py"
    found = []
    if not any(name == chapter and reason == READING_TIME for (name, _), reason in TYPED.items()):
        found.append(f"chapter {chapter}: list the opening's time estimate (how long the notebook runs, e.g. "
                     f'"about 2 minutes") in {where}: ("{chapter}", "2 minutes"): "{READING_TIME}"')
    if chapter in CHAPTERS:
        typed = [t for t in typed_measurements(CHAPTERS[chapter]) if (chapter, t) not in TYPED]
        found += [f"chapter {chapter}: the prose types {t!r}: glue it, or list it in {where} with why it may be typed"
                  for t in typed]
    return found


def missing_from_scratch(chapter: str) -> list[str]:
    """The chapter's HiddenTests(from_scratch=...) names only its exercises, and every exercise named
    as a built-in the grader refuses (``verdict.ATTENTION_BUILTINS``, ``BUILTIN_MODULES``)."""
    hidden = ROOT / f"{C.hidden_module(chapter).replace('.', '/')}.py"
    if not hidden.exists():
        return [f"chapter {chapter}: its hidden cells declare no `hidden = HiddenTests(ref, from_scratch={{...}})` "
                "(the exercises that may not call PyTorch's attention built-ins): write them, then `make generate`"]
    from autograder.chapters import ChapterInfo
    info = ChapterInfo(chapter)
    exercises, from_scratch = set(info.exercises), info.hidden().from_scratch
    where = f"HiddenTests(..., from_scratch=...) in course/{chapter}.py"
    found = [f"chapter {chapter}: {name!r} in {where} is no exercise of the chapter (a misspelt name forbids nothing)"
             for name in sorted(from_scratch - exercises)]
    found += [f"chapter {chapter}: add {name!r} to {where}: PyTorch has a built-in of that name, which the grader "
              "refuses only in a from-scratch exercise" for name in sorted(exercises & FORBIDDEN_BUILTINS - from_scratch)]
    return found


def _assigned(path, name: str):
    """The value of a module-level ``NAME = <literal or call>`` in PATH's source, as its AST node."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return node.value
    return None


def missing_catalog(chapter: str) -> list[str]:
    path = TESTS / f"test_grading_ch{chapter[:2]}.py"
    if not path.exists():
        return [f"chapter {chapter}: write {path.relative_to(ROOT)}: CHAPTER = {chapter!r}, CATALOG = "
                "Catalog(CHAPTER, correct=..., mistakes=..., independent=..., tampering=...) and "
                "`class TestCatalog(CatalogTests): catalog = CATALOG` (tests/catalog.py)"]
    declared = _assigned(path, "CHAPTER")
    if not (isinstance(declared, ast.Constant) and declared.value == chapter):
        return [f"chapter {chapter}: {path.relative_to(ROOT)} must set CHAPTER = {chapter!r}"]
    if not isinstance(_assigned(path, "CATALOG"), ast.Call):
        return [f"chapter {chapter}: {path.relative_to(ROOT)} must declare CATALOG = Catalog(CHAPTER, ...)"]
    return []


def missing_reference_tests(chapter: str) -> list[str]:
    path = TESTS / f"test_reference_ch{chapter[:2]}.py"
    if path.exists():
        return []
    return [f"chapter {chapter}: write {path.relative_to(ROOT)}: the reference checked against PyTorch "
            "(or the published implementation it follows)"]


def missing_module_seconds(chapter: str) -> list[str]:
    module = f"test_grading_ch{chapter[:2]}"
    if module in json.loads(DEFAULT_MODULE_SECONDS.read_text()):
        return []
    return [f'chapter {chapter}: add "{module}": <seconds> to {DEFAULT_MODULE_SECONDS.relative_to(ROOT)} (its seconds in '
            "`make test`, the test scheduler's default until a run records them; the catalogs are among the longest)"]


# In ARCHITECTURE.md's order: "Where a new chapter plugs in" names each test below.
CHECKS = [missing_source, missing_generated_files, missing_toc_entry, missing_intro_row, missing_readme_row,
          missing_spec, missing_translation, missing_typed_numbers, missing_from_scratch, missing_catalog,
          missing_reference_tests, missing_module_seconds]


def _test(check) -> None:
    def test(chapter):
        problems = check(chapter)
        assert not problems, "\n".join(problems)
    test.__name__ = f"test_chapter_has_{check.__name__.removeprefix('missing_')}"
    test.__doc__ = f"The chapter has what {check.__name__} looks for (ARCHITECTURE.md's checklist)."
    return pytest.mark.parametrize("chapter", C.chapter_names())(test)


for _check in CHECKS:
    _checked = _test(_check)
    globals()[_checked.__name__] = _checked


def test_each_check_finds_what_a_chapter_without_files_lacks():
    """A chapter with nothing (no source, files, entries, tests) fails every check, each with its own
    message naming the chapter: the checks find what is missing rather than pass vacuously."""
    nothing = "97_nothing_yet"
    for check in CHECKS:
        problems = check(nothing)
        assert problems and all(p.startswith(f"chapter {nothing}: ") for p in problems), (check.__name__, problems)


def test_the_checklist_in_architecture_names_each_check_in_order():
    """ARCHITECTURE.md's "Where a new chapter plugs in" names every check's test, in CHECKS' order."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Where a new chapter plugs in"):].split("\n## ", 1)[0]
    names = [f"test_chapter_has_{check.__name__.removeprefix('missing_')}" for check in CHECKS]
    found = re.findall(r"test_chapter_has_\w+", section)
    assert found == names, f"ARCHITECTURE.md's checklist should name, in this order: {names}; it names {found}"


def test_an_untranslated_row_and_a_misspelt_from_scratch_name_are_found(monkeypatch):
    """The checks that read a present chapter's details fire too: its intro row left untranslated, a
    from-scratch name that is no exercise, and an exercise named as a forbidden built-in not from scratch."""
    import autograder.chapters
    chapter = "05_transformer"  # has an exercise named Transformer, as nn.Transformer
    monkeypatch.setattr(catalogs, "translations", lambda domain, language: {})
    assert "translate the entry of intro.md" in " ".join(missing_intro_row(chapter))

    class Misspelt:
        from_scratch = {"Transformr"}
    monkeypatch.setattr(autograder.chapters.ChapterInfo, "hidden", lambda self: Misspelt)
    problems = " ".join(missing_from_scratch(chapter))
    assert "'Transformr'" in problems and "no exercise" in problems and "add 'Transformer'" in problems
