"""The course's conventions, in one place: names, paths, markers, cell roles.

Both ``coursegen`` (which writes the notebooks) and ``autograder`` (which grades them)
read them from here, so the two cannot disagree.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COURSE_ID = "attention-from-scratch"

COURSE_DIR = ROOT / "course"  # chapter sources: the single source of each chapter
SOURCE_DIR = ROOT / "source"  # generated nbgrader instructor notebooks
CHAPTERS_DIR = ROOT / "chapters"  # generated learner notebooks
SOLUTIONS_PACKAGE = "solutions"  # generated reference and hidden-test modules

SOURCE_LANGUAGE = "en"  # the language course/ is written in
TRANSLATIONS = ("zh_CN",)  # each has catalogs in locales/<language>/LC_MESSAGES (see coursegen.catalogs)
EDITIONS = (SOURCE_LANGUAGE, *TRANSLATIONS)
LOCALES_DIR = ROOT / "locales"
# Fonts an edition's figures are drawn with, before DejaVu Sans: the first one installed wins.
FIGURE_FONTS = {"zh_CN": ("Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Microsoft YaHei",
                          "SimHei", "WenQuanYi Zen Hei")}

# The setup's comment, in the edition's language (learners read it in their notebook).
FIGURE_FONT_NOTE = {"zh_CN": ("# 图中的文字使用本版的语言：本机装有的字体中，下面列出的第一个排在\n"
                              "# 最前面，因为公式 $math$ 周围的文字只用第一个字体（一个都没有时，\n"
                              "# matplotlib 会画出方框并发出警告）。\n")}

CHAPTER_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
GENERATED_NOTE = "generated from {src} by `make generate`; do not edit"


def chapter_names() -> list[str]:
    """Every chapter of the course, in order: one per source file in ``course/``."""
    return [p.stem for p in sorted(COURSE_DIR.glob("[0-9][0-9]_*.py")) if CHAPTER_NAME.match(p.stem)]


def _edition(folder: Path, language: str) -> Path:
    """English files sit in FOLDER; a translation's in FOLDER/<language>."""
    if language != SOURCE_LANGUAGE and language not in TRANSLATIONS:
        raise ValueError(f"no {language!r} edition (the course has {SOURCE_LANGUAGE}, {', '.join(TRANSLATIONS)})")
    return folder if language == SOURCE_LANGUAGE else folder / language


def instructor_notebook(chapter: str, language: str = SOURCE_LANGUAGE) -> Path:
    return _edition(SOURCE_DIR, language) / chapter / f"{chapter}.ipynb"


def learner_notebook(chapter: str, language: str = SOURCE_LANGUAGE) -> Path:
    return _edition(CHAPTERS_DIR, language) / f"{chapter}.ipynb"


def language_of(nb) -> str:
    """The edition a notebook belongs to (its metadata says; English when it does not)."""
    meta = nb.get("metadata", {}).get("course")
    language = meta.get("language") if isinstance(meta, dict) else None
    return language if language in TRANSLATIONS else SOURCE_LANGUAGE


def figure_font_setup(language: str) -> str:
    """Code a translated notebook runs after importing pyplot, so its figures draw its script."""
    if language not in FIGURE_FONTS:
        return ""
    fonts = "".join(f'    "{name}",\n' for name in FIGURE_FONTS[language])
    return (
        "\n\n" + FIGURE_FONT_NOTE[language] +
        "from matplotlib import font_manager\n"
        f"_figure_fonts = [\n{fonts}]\n"
        "_installed = {font.name for font in font_manager.fontManager.ttflist}\n"
        'plt.rcParams["font.family"] = [\n'
        '    *(name for name in _figure_fonts if name in _installed), "DejaVu Sans"]')


def reference_module(chapter: str) -> str:
    """Import name of the chapter's reference solution, e.g. ``solutions.ch02_self_attention``."""
    return f"{SOLUTIONS_PACKAGE}.ch{chapter}"


def hidden_module(chapter: str) -> str:
    return f"{reference_module(chapter)}_hidden"


def exercise_of(test_id: str, exercises) -> str | None:
    """The exercise a test cell belongs to: the longest name that ``test_<name>`` starts."""
    owners = [e for e in exercises if test_id == f"test_{e}" or test_id.startswith(f"test_{e}_")]
    return max(owners, key=len) if owners else None


# ------------------------------------------------------------------ cells

def grade_id(cell) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta.get("grade_id") if isinstance(meta, dict) else None


def is_test_cell(cell) -> bool:
    """An nbgrader autograder test cell (graded, read-only, code)."""
    from nbgrader.utils import is_grade  # nbgrader takes seconds to import: only when needed
    return cell.get("cell_type") == "code" and _nbgrader_dict(cell) and is_grade(cell) and bool(grade_id(cell))


def is_answer_cell(cell) -> bool:
    """An nbgrader answer cell (the learner writes the solution)."""
    from nbgrader.utils import is_solution
    return _nbgrader_dict(cell) and is_solution(cell) and bool(grade_id(cell))


def is_written_cell(cell) -> bool:
    """An nbgrader manually graded answer: a markdown answer cell the learner writes, graded by hand.

    It is an answer cell too (``is_answer_cell``: a submission keeps the learner's text), but no
    exercise: the judge never scores it, and its points are outside the automatic score."""
    meta = cell.get("metadata", {}).get("nbgrader")
    return (cell.get("cell_type") == "markdown" and isinstance(meta, dict) and bool(meta.get("solution"))
            and bool(meta.get("grade")) and bool(grade_id(cell)))


def is_exercise_cell(cell) -> bool:
    """An answer cell of code: an exercise, graded automatically by its test cells."""
    return cell.get("cell_type") == "code" and is_answer_cell(cell)


def written_points(nb) -> dict[str, float]:
    """grade id -> points of each written answer (graded by hand) of a notebook, in order."""
    return {grade_id(c): points(c) for c in nb.cells if is_written_cell(c)}


def written_answers(nb) -> dict[str, dict]:
    """grade id -> ``{"max_score": points, "answered": bool}`` of each written answer of a submission.

    Unanswered is nbgrader's rule: the cell's checksum (set when the chapter was released) still
    matches, i.e. the prompt is unchanged; nbgrader then scores it 0 itself and asks no grader."""
    from nbgrader.utils import compute_checksum
    found = {}
    for cell in nb.cells:
        if is_written_cell(cell):
            checksum = cell.metadata["nbgrader"].get("checksum")
            found[grade_id(cell)] = {"max_score": points(cell),
                                     "answered": checksum is None or checksum != compute_checksum(cell)}
    return found


def written_in_table(grade: dict) -> tuple[float, float, str]:
    """(score, max_score, note) of a written answer in a table of scores, from its gradebook grade
    (``{"score", "max_score", "manual", "needs_manual_grade"}``): its points count once a person
    has scored it, and until then it is neither scored nor lost."""
    top = f"{grade['max_score']:g}"
    if grade["manual"]:
        return grade["score"], grade["max_score"], "scored by hand"
    if grade["needs_manual_grade"]:
        return 0.0, 0.0, f"to be graded by hand ({top} points)"
    return 0.0, 0.0, f"not answered (nbgrader scores it 0 / {top} until a grader scores it)"


def points(cell) -> float:
    return float(cell.metadata["nbgrader"]["points"])


def role(cell) -> str | None:
    """``given`` (demo code, not run while grading), ``export`` (needed by exercises) or None."""
    meta = cell.get("metadata", {}).get("course")
    return meta.get("role") if isinstance(meta, dict) else None


def _nbgrader_dict(cell) -> bool:
    return isinstance(cell.get("metadata", {}).get("nbgrader"), dict)


def split_hidden(source: str) -> tuple[list[str], list[str]]:
    """(visible lines, hidden-test lines) of a test cell's source."""
    visible, hidden, inside = [], [], False
    for line in source.splitlines():
        if line.strip() == HIDDEN_BEGIN:
            inside = True
        elif line.strip() == HIDDEN_END:
            inside = False
        else:
            (hidden if inside else visible).append(line)
    return visible, hidden


def strip_solution_markers(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if line.strip() not in (SOLUTION_BEGIN, SOLUTION_END))


# ------------------------------------------------------------------ processes

def with_python_bin_on_path(env: dict | None = None) -> dict:
    """nbgrader shells out to ``alembic``: put this interpreter's bin/ first on PATH."""
    env = dict(os.environ if env is None else env)
    bin_dir = str(Path(sys.executable).parent)
    if env.get("PATH", "").split(os.pathsep)[0] != bin_dir:
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env
