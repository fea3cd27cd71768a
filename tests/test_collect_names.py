"""collect: every name a submission brings (chapter, student id from a file or folder name) is
checked before it touches a path, and no file is overwritten or left out without a line saying so
(issue 45 hole 5, issue 46 item 1). Fast (collect alone) but for the last test, which grades a
small class of Unicode student ids end to end."""
from __future__ import annotations

import copy
import csv
import hashlib
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from class_runs import CHAPTER, cli, new_course
from support import ROOT

from autograder.classroom.collect import OLDER, collect, submissions
from autograder.classroom.folders import student_id

LEARNER = json.loads((ROOT / "chapters" / f"{CHAPTER}.ipynb").read_text())
T0 = 1_700_000_000 * 10**9  # a file's time (ns); tests set it, as an LMS's archive does


def notebook(tag: str = "", chapter: object = CHAPTER) -> str:
    """The learner notebook, told apart by TAG; CHAPTER in its metadata (None: no chapter there)."""
    nb = copy.deepcopy(LEARNER)
    if chapter is None:
        del nb["metadata"]["course"]["chapter"]
    else:
        nb["metadata"]["course"]["chapter"] = chapter
    nb["metadata"]["tag"] = tag
    return json.dumps(nb)


def put(path: Path, text: str, when: int = T0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.utime(path, ns=(when, when))
    return path


def tree(folder: Path, skip: Path | None = None) -> dict[str, tuple]:
    """Every entry under FOLDER (links not followed): its kind, and its content or target."""
    out = {}
    for here, folders, files in os.walk(folder):
        for name in folders + files:
            path = Path(here) / name
            if skip is not None and (path == skip or skip in path.parents):
                continue
            if path.is_symlink():
                out[str(path)] = ("link", os.readlink(path))
            elif path.is_dir():
                out[str(path)] = ("folder",)
            elif path.is_file():
                out[str(path)] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
            else:
                out[str(path)] = ("other",)
        folders[:] = [f for f in folders if not (Path(here) / f).is_symlink()]
    return out


def by_source(outcomes) -> dict[str, list]:
    lines: dict[str, list] = {}
    for o in outcomes:
        lines.setdefault(o.source, []).append(o)
    return lines


def tag_of(path: Path) -> str:
    return json.loads(path.read_text(encoding="utf-8"))["metadata"]["tag"]


def submitted(course: Path) -> dict[str, str]:
    """student/chapter -> the tag of the notebook collect filed as the submission."""
    return {f"{p.parts[-3]}/{p.parts[-2]}": tag_of(p) for p in (course / "submitted").glob("*/*/*.ipynb")}


def older(course: Path, student: str, chapter: str = CHAPTER) -> list[str]:
    return sorted(tag_of(p) for p in (course / "submitted" / student / chapter / OLDER).glob("*.ipynb"))


@pytest.fixture
def around(tmp_path):
    """tmp_path holds the source, the course and a folder outside both (links and paths aim there):
    the test checks that nothing but the course changed."""
    outside = tmp_path / "outside"
    put(outside / CHAPTER / f"{CHAPTER}.ipynb", notebook("outside"))
    put(outside / "secret.ipynb", notebook("secret"))
    yield tmp_path, tmp_path / "src", tmp_path / "course", outside


# ------------------------------------------------------------------ issue 45: nothing written outside
BAD_CHAPTERS = ["../../../escaped/x", "{outside}/evil", "/etc/cron.d/x", f"{CHAPTER}/../../../x", "..", ".",
                "source", "chapters", "", f"{CHAPTER}\n", f"{CHAPTER}/", 42, ["02_self_attention"], {"a": 1}]


@pytest.mark.parametrize("chapter", BAD_CHAPTERS, ids=repr)
def test_a_chapter_from_metadata_never_becomes_a_path(around, chapter):
    tmp, src, course, outside = around
    if isinstance(chapter, str):
        chapter = chapter.replace("{outside}", str(outside))
    put(src / "mallory.ipynb", notebook("mallory", chapter))
    put(src / "ada.ipynb", notebook("ada"))
    before = tree(tmp, skip=course)
    lines = by_source(collect(src, course))
    assert tree(tmp, skip=course) == before  # nothing outside the course changed
    assert [o.action for o in lines["mallory.ipynb"]] == ["refused"]
    assert "not a chapter of the course" in lines["mallory.ipynb"][0].line()
    assert submitted(course) == {f"ada/{CHAPTER}": "ada"}  # the rest of the class goes on
    files = {str(p.relative_to(course)) for p in course.rglob("*") if p.is_file()}
    assert files == {f"submitted/ada/{CHAPTER}/{CHAPTER}.ipynb", f"submitted/ada/{CHAPTER}/timestamp.txt",
                     "collect-log.txt"}  # the submission's time, as nbgrader's exchange writes it


REFUSED_NAMES = ["a\nb", "tab\there", "x*y", "a+b", "a?b", "a[1]", "=1+1", "-rf", "@home", "ok\u202eevil",
                 "back\\slash", "_static", "x" * 201, " ", "bad\udcffutf8", ".hidden"]
ALLOWED_NAMES = ["O'Brien & <Co>", "ana maría", "李雷", "Zoë_李", "a]b", "two  spaces", "ZWJ\u200dname", "con"]


def every_position(src: Path, name: str) -> dict[str, Path]:
    """A notebook whose student is NAME in each place collect reads one: place -> the folder to collect.
    (Canvas's names never hold '_': it takes letters and digits of a name.)"""
    made = {
        "flat": Path(f"{name}.ipynb"),
        "nbgrader": Path(name, CHAPTER, f"{CHAPTER}.ipynb"),
        "moodle folder": Path(f"{name}_99_assignsubmission_file_", "work.ipynb"),
        "moodle flat": Path(f"{name}_98_assignsubmission_file_{CHAPTER}.ipynb"),
    }
    if "_" not in name:
        made["canvas"] = Path(f"{name}_123_456_{CHAPTER}.ipynb")
        made["canvas late"] = Path(f"{name}_LATE_123_457_{CHAPTER}-2.ipynb")
    for place, path in made.items():
        put(src / place / path, notebook(name))
    return {place: src / place for place in made}


@pytest.mark.parametrize("name", REFUSED_NAMES, ids=repr)
def test_names_that_cannot_be_student_ids_are_refused_everywhere(around, name):
    tmp, src, course, _ = around
    before = None
    for place, root in every_position(src, name).items():
        before = before or tree(tmp, skip=course)
        outcomes = collect(root, course)
        assert [o.action for o in outcomes] in (["refused"], ["skipped"]), (place, [o.line() for o in outcomes])
        assert all("\n" not in o.line() for o in outcomes)
    assert tree(tmp, skip=course) == before
    assert not (course / "submitted").exists() or not list((course / "submitted").iterdir())


@pytest.mark.parametrize("name", ALLOWED_NAMES, ids=repr)
def test_odd_but_safe_names_are_kept_as_typed_everywhere(around, name):
    tmp, src, _, _ = around
    for index, (place, root) in enumerate(every_position(src, name).items()):
        course = tmp / f"course-{index}"
        outcomes = collect(root, course)
        assert [o.action for o in outcomes] == ["collected"], (place, [o.line() for o in outcomes])
        assert submitted(course) == {f"{name}/{CHAPTER}": name}, place


def test_symbolic_links_are_never_followed(around):
    tmp, src, course, outside = around
    put(src / "ada" / CHAPTER / f"{CHAPTER}.ipynb", notebook("ada"))
    (src / "mallory").symlink_to(outside)                                # a student folder out
    (src / "eve").mkdir()
    (src / "eve" / CHAPTER).symlink_to(outside / CHAPTER)                # a chapter folder out
    (src / "dan" / CHAPTER).mkdir(parents=True)                          # another student's file
    (src / "dan" / CHAPTER / f"{CHAPTER}.ipynb").symlink_to(src / "ada" / CHAPTER / f"{CHAPTER}.ipynb")
    flat = src / "flat"
    put(flat / "ben.ipynb", notebook("ben"))
    (flat / "passwd.ipynb").symlink_to("/etc/passwd")
    (flat / "copycat.ipynb").symlink_to(flat / "ben.ipynb")
    (flat / "broken.ipynb").symlink_to(tmp / "nowhere")
    os.mkfifo(flat / "fifo.ipynb")                                       # never opened for reading
    before = tree(tmp, skip=course)
    lines = by_source(collect(src, course))
    assert tree(tmp, skip=course) == before
    assert submitted(course) == {f"ada/{CHAPTER}": "ada"}
    for link in ("mallory/", "eve/02_self_attention/", f"dan/{CHAPTER}/{CHAPTER}.ipynb"):
        assert [o.action for o in lines[link]] == ["refused"] and "symbolic link" in lines[link][0].detail, link
    lines = by_source(collect(flat, course))
    assert submitted(course) == {f"ada/{CHAPTER}": "ada", f"ben/{CHAPTER}": "ben"}
    for name in ("passwd.ipynb", "copycat.ipynb", "broken.ipynb"):
        assert "symbolic link" in lines[name][0].detail and lines[name][0].action == "refused", name
    assert lines["fifo.ipynb"][0].action == "refused" and "not a regular file" in lines["fifo.ipynb"][0].detail
    assert not any("root:" in p.read_text(errors="replace") for p in course.rglob("*") if p.is_file())
    assert tree(tmp, skip=course) == before


def test_a_source_whose_submitted_folder_is_a_link_is_not_read_through_it(around):
    tmp, src, course, outside = around
    src.mkdir()
    (src / "submitted").symlink_to(outside)
    lines = by_source(collect(src, course))
    assert [o.action for o in lines["submitted/"]] == ["refused"]
    assert not (course / "submitted").exists()


def test_links_in_the_course_folder_are_not_written_through(around):
    tmp, src, course, outside = around
    for student in ("ada", "ben", "cleo"):
        put(src / f"{student}.ipynb", notebook(student))
    (course / "submitted" / "ben" / CHAPTER).mkdir(parents=True)
    (course / "submitted" / "ada").symlink_to(outside)                               # a student folder out
    (course / "submitted" / "ben" / CHAPTER / OLDER).symlink_to(outside)              # its .older/ out
    (course / "submitted" / "cleo" / CHAPTER).mkdir(parents=True)                     # the submission a link
    (course / "submitted" / "cleo" / CHAPTER / f"{CHAPTER}.ipynb").symlink_to(outside / "secret.ipynb")
    before = tree(tmp, skip=course)
    lines = by_source(collect(src, course))
    assert tree(tmp, skip=course) == before
    assert lines["ada.ipynb"][0].action == lines["ben.ipynb"][0].action == "refused"
    assert "symbolic link" in lines["ada.ipynb"][0].detail
    cleo = course / "submitted" / "cleo" / CHAPTER / f"{CHAPTER}.ipynb"
    assert lines["cleo.ipynb"][0].action == "collected" and not cleo.is_symlink() and tag_of(cleo) == "cleo"


def test_the_course_folder_inside_the_source_is_not_collected_again(around):
    tmp, src, course, _ = around
    put(src / "ada" / CHAPTER / f"{CHAPTER}.ipynb", notebook("ada"))
    inner = src / "my-class"
    collect(src, inner)
    put(inner / "release" / CHAPTER / f"{CHAPTER}.ipynb", notebook("handout"))
    put(inner / "source" / CHAPTER / f"{CHAPTER}.ipynb", notebook("instructor"))
    lines = by_source(collect(src, inner))
    assert lines["my-class/"][0].detail == "skipped: the course folder itself"
    assert submitted(inner) == {f"ada/{CHAPTER}": "ada"}
    assert lines[f"ada/{CHAPTER}/{CHAPTER}.ipynb"][0].action == "unchanged"


@pytest.mark.parametrize("student", ["../../x", "/tmp/attn-x", "", ".", "a/b", "x*", "_static"], ids=repr)
def test_grade_refuses_a_student_id_that_cannot_be_one_in_one_line(tmp_path, student):
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(ROOT / "chapters" / f"{CHAPTER}.ipynb"),
                           "--student", student, "--feedback-dir", str(tmp_path / "fb")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: --student"), proc.stderr
    assert "cannot be a student id" in lines[0] and proc.stdout == ""
    assert not (tmp_path / "fb").exists()


def test_grade_refuses_a_chapter_that_is_a_path_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(ROOT / "chapters" / f"{CHAPTER}.ipynb"),
                           "--chapter", "../../x", "--feedback-dir", str(tmp_path / "fb")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "cannot tell which chapter" in lines[0], proc.stderr
    assert not (tmp_path / "fb").exists()
    with pytest.raises(ValueError, match="unknown chapter"):
        collect(tmp_path, tmp_path / "course", "../../x")


def test_an_nbgrader_course_folder_is_not_read_as_its_students(around):
    """A course folder without submitted/ collected as a source: its release/ and source/ (the
    instructor's solutions) are no students, and nothing deeper than nbgrader's layout is read."""
    _, src, course, _ = around
    put(src / "release" / CHAPTER / f"{CHAPTER}.ipynb", notebook("handout"))
    put(src / "source" / CHAPTER / f"{CHAPTER}.ipynb", notebook("solutions"))
    put(src / "autograded" / "ada" / CHAPTER / f"{CHAPTER}.ipynb", notebook("graded copy"))
    put(src / "old" / f"doejane_1_2_{CHAPTER}.ipynb", notebook("deep canvas"))
    put(src / "ben" / CHAPTER / f"{CHAPTER}.ipynb", notebook("ben"))
    lines = by_source(collect(src, course))
    assert submitted(course) == {f"ben/{CHAPTER}": "ben"}
    assert lines[f"source/{CHAPTER}/{CHAPTER}.ipynb"][0].detail.startswith("refused: source/ is a folder of an nbgrader")
    assert lines[f"autograded/ada/{CHAPTER}/{CHAPTER}.ipynb"][0].detail.startswith("refused: not in a layout")
    assert lines[f"old/doejane_1_2_{CHAPTER}.ipynb"][0].action == "refused"


# ------------------------------------------------------------------ issue 46: nothing lost without a word
def test_unicode_names_are_kept_not_folded_into_each_other(around):
    _, src, course, _ = around
    for name in ("Zoë_李", "Zoé", "ana maría", "Zo"):
        put(src / f"{name}.ipynb", notebook(name))
    outcomes = collect(src, course)
    assert [o.action for o in outcomes] == ["collected"] * 4
    assert submitted(course) == {f"{n}/{CHAPTER}": n for n in ("Zoë_李", "Zoé", "ana maría", "Zo")}


def test_a_name_typed_two_ways_is_one_student_the_latest_file_kept(around):
    """NFC (as Windows and Linux type it) and NFD (as macOS stores it): one student, in NFC."""
    _, src, course, _ = around
    nfc, nfd = unicodedata.normalize("NFC", "Zoé"), unicodedata.normalize("NFD", "Zoé")
    assert nfc != nfd
    put(src / f"{nfc}.ipynb", notebook("first"), T0)
    put(src / f"{nfd}.ipynb", notebook("second"), T0 + 60 * 10**9)
    lines = by_source(collect(src, course))
    assert [o.action for o in lines[f"{nfd}.ipynb"]] == ["collected"]
    assert [o.action for o in lines[f"{nfc}.ipynb"]] == ["older"]
    assert submitted(course) == {f"{nfc}/{CHAPTER}": "second"} and older(course, nfc) == ["first"]
    assert student_id(nfd) == nfc


def test_a_second_collect_never_replaces_a_submission_without_a_word(around):
    """s01_full.ipynb collected (10/10), then another s01_full.ipynb: the later one is the
    submission, the other is kept and said to be; collecting either again changes nothing."""
    tmp, _, course, _ = around
    first, second, stale = tmp / "download-1", tmp / "download-2", tmp / "download-0"
    put(first / "s01_full.ipynb", notebook("full marks"), T0)
    put(second / "s01_full.ipynb", notebook("half marks"), T0 + 3600 * 10**9)
    put(stale / "s01_full.ipynb", notebook("a draft"), T0 - 3600 * 10**9)
    assert [o.action for o in collect(first, course)] == ["collected"]
    replaced = collect(second, course)
    assert [o.action for o in replaced] == ["collected"] and "newer than the one collected before" in replaced[0].detail
    assert submitted(course) == {f"s01_full/{CHAPTER}": "half marks"} and older(course, "s01_full") == ["full marks"]
    kept = collect(stale, course)
    assert [o.action for o in kept] == ["older"] and "s01_full.ipynb" in kept[0].detail
    assert submitted(course) == {f"s01_full/{CHAPTER}": "half marks"}
    assert older(course, "s01_full") == ["a draft", "full marks"]
    for again in (first, second, stale):  # the same downloads collected again: nothing new
        assert [o.action for o in collect(again, course)] == ["unchanged"]
    assert older(course, "s01_full") == ["a draft", "full marks"]


@pytest.mark.parametrize("copy_is_later", [True, False])
def test_a_chapter_folder_with_a_copy_keeps_the_latest_and_lists_both(around, copy_is_later):
    _, src, course, _ = around
    folder = src / "ada" / CHAPTER
    put(folder / f"{CHAPTER}.ipynb", notebook("original"), T0 + (0 if copy_is_later else 60 * 10**9))
    put(folder / f"{CHAPTER}-Copy1.ipynb", notebook("copy"), T0 + (60 * 10**9 if copy_is_later else 0))
    lines = by_source(collect(src, course))
    later, earlier = ("copy", "original") if copy_is_later else ("original", "copy")
    assert submitted(course) == {f"ada/{CHAPTER}": later} and older(course, "ada") == [earlier]
    actions = {s: [o.action for o in ls] for s, ls in lines.items()}
    name = {"copy": f"ada/{CHAPTER}/{CHAPTER}-Copy1.ipynb", "original": f"ada/{CHAPTER}/{CHAPTER}.ipynb"}
    assert actions == {name[later]: ["collected"], name[earlier]: ["older"]}


def test_two_different_files_equally_late_are_both_refused_each_naming_the_other(around):
    _, src, course, _ = around
    folder = src / "ada" / CHAPTER
    put(folder / f"{CHAPTER}.ipynb", notebook("one"))
    put(folder / f"{CHAPTER}-Copy1.ipynb", notebook("two"))
    put(folder / "identical.ipynb", notebook("one"))  # the same bytes as one: not a second file
    put(src / "ben" / CHAPTER / f"{CHAPTER}.ipynb", notebook("ben"))
    lines = by_source(collect(src, course))
    one, two = f"ada/{CHAPTER}/{CHAPTER}.ipynb", f"ada/{CHAPTER}/{CHAPTER}-Copy1.ipynb"
    assert lines[one][0].action == lines[two][0].action == "refused"
    assert "Copy1" in lines[one][0].detail and f"{CHAPTER}.ipynb" in lines[two][0].detail
    assert lines[f"ada/{CHAPTER}/identical.ipynb"][0].action == "unchanged"
    assert submitted(course) == {f"ben/{CHAPTER}": "ben"}


def test_canvas_names_are_one_student_with_resubmissions(around):
    """<name>_<user id>_<file id>_<file>, _LATE_ after the name, -1 for a file uploaded again: one
    student; the latest upload is the submission even when the archive gives every file one time.
    The chapter comes from the file's name when its metadata has none."""
    _, src, course, _ = around
    put(src / f"doejane_12345_678_{CHAPTER}.ipynb", notebook("on time", chapter=None))
    put(src / f"doejane_LATE_12345_990_{CHAPTER}-1.ipynb", notebook("late resubmission", chapter=None))
    put(src / "smithjohn_222_333_homework.ipynb", notebook("john"))
    lines = by_source(collect(src, course))
    assert submitted(course) == {f"doejane/{CHAPTER}": "late resubmission", f"smithjohn/{CHAPTER}": "john"}
    assert older(course, "doejane") == ["on time"]
    assert lines[f"doejane_12345_678_{CHAPTER}.ipynb"][0].action == "older"


def test_two_canvas_users_with_one_name_are_refused_not_merged(around):
    _, src, course, _ = around
    put(src / f"leeann_111_1_{CHAPTER}.ipynb", notebook("first lee ann"))
    put(src / f"leeann_999_2_{CHAPTER}.ipynb", notebook("second lee ann"))
    put(src / "ada.ipynb", notebook("ada"))
    lines = by_source(collect(src, course))
    for mine, other in ((f"leeann_111_1_{CHAPTER}.ipynb", "999"), (f"leeann_999_2_{CHAPTER}.ipynb", "111")):
        assert lines[mine][0].action == "refused" and f"user {other}" in lines[mine][0].detail
    assert submitted(course) == {f"ada/{CHAPTER}": "ada"}


def test_moodle_folders_and_flat_names_are_parsed(around):
    _, src, course, _ = around
    put(src / "Jane Doe_4242_assignsubmission_file_" / f"{CHAPTER}.ipynb", notebook("folder", chapter=None), T0)
    put(src / f"Jane Doe_4242_assignsubmission_file_{CHAPTER}.ipynb", notebook("flat, later"), T0 + 10**9)
    put(src / "Ōtsuka Ren_77_assignsubmission_file_" / "notes.ipynb", notebook("ren"))
    collect(src, course)
    assert submitted(course) == {f"Jane Doe/{CHAPTER}": "flat, later", f"Ōtsuka Ren/{CHAPTER}": "ren"}
    assert older(course, "Jane Doe") == ["folder"]


def test_every_file_gets_one_line_on_the_command_line(around):
    tmp, src, course, _ = around
    put(src / "ada.ipynb", notebook("ada"))
    put(src / "readme.txt", "not a notebook")
    put(src / ".DS_Store", "")
    put(src / "__MACOSX" / "._ada.ipynb", "")
    put(src / ".ipynb_checkpoints" / "ada-checkpoint.ipynb", notebook("checkpoint"))
    put(src / "deep" / "x.ipynb", notebook("x"))
    put(src / "new\nline.ipynb", notebook("newline"))
    put(src / f"{CHAPTER}.ipynb", notebook("no student"))
    put(src / "nochapter.ipynb", notebook("?", chapter=None))
    with open(os.path.join(os.fsencode(src), b"\xff\xfe.ipynb"), "w") as f:  # not UTF-8
        f.write(notebook("bytes"))
    proc = cli("collect", str(src), "--course", str(course))
    lines = proc.stdout.splitlines()
    expected = {"'ada.ipynb': collected", "'readme.txt': skipped: not a notebook", "'.DS_Store': skipped: a hidden",
                "'__MACOSX/': skipped", "'.ipynb_checkpoints/': skipped: Jupyter", "'deep/x.ipynb': refused: not in a layout",
                "'new\\nline.ipynb': refused", f"'{CHAPTER}.ipynb': refused: named like a chapter",
                "'nochapter.ipynb': refused: cannot tell its chapter", "'\\udcff\\udcfe.ipynb': refused"}
    assert len(lines) == len(expected) + 1, proc.stdout
    for start in expected:
        assert sum(line.startswith(start) for line in lines) == 1, (start, proc.stdout)
    assert lines[-1].startswith("1 collected into") and "5 refused" in lines[-1]
    log = (course / "collect-log.txt").read_text()
    assert all(line in log for line in lines[:-1])


def test_nbgrader_reads_no_file_kept_as_older(around):
    """nbgrader's own autograde, run in the course folder, grades <chapter>/*.ipynb and copies the
    folder's other files but notebooks: nothing of .older/ (its own path rules, read here)."""
    import glob

    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import find_all_files
    _, src, course, _ = around
    put(src / "ada" / CHAPTER / f"{CHAPTER}.ipynb", notebook("new"), T0 + 10**9)
    put(src / "ada" / CHAPTER / "draft.ipynb", notebook("old"), T0)
    collect(src, course)
    assert older(course, "ada") == ["old"]
    coursedir = CourseDirectory(root=str(course))
    folder = coursedir.format_path(coursedir.submitted_directory, "ada", CHAPTER)
    assert glob.glob(os.path.join(folder, coursedir.notebook_id + ".ipynb")) == [os.path.join(folder, f"{CHAPTER}.ipynb")]
    # nbgrader's autograde copies the other files: only the submission's time, no older notebook
    assert find_all_files(folder, coursedir.ignore + ["*.ipynb"]) == [os.path.join(folder, "timestamp.txt")]


def test_grade_class_grades_the_submission_only(around):
    """submissions(): <chapter>.ipynb, never .older/, a copy beside it or a folder that is a link."""
    _, src, course, outside = around
    put(src / "ada" / CHAPTER / f"{CHAPTER}.ipynb", notebook("new"), T0 + 10**9)
    put(src / "ada" / CHAPTER / "old.ipynb", notebook("old"), T0)
    collect(src, course)
    put(course / "submitted" / "ben" / CHAPTER / f"{CHAPTER}-Copy1.ipynb", notebook("ben copy"))
    put(course / "submitted" / "ben" / CHAPTER / f"{CHAPTER}.ipynb", notebook("ben"))
    put(course / "submitted" / "cleo" / CHAPTER / "renamed.ipynb", notebook("cleo"))
    put(course / "submitted" / "dan" / CHAPTER / "a.ipynb", notebook("dan a"))
    put(course / "submitted" / "dan" / CHAPTER / "b.ipynb", notebook("dan b"))
    (course / "submitted" / "eve").symlink_to(outside)
    put(course / "submitted" / "x*" / CHAPTER / f"{CHAPTER}.ipynb", notebook("glob"))
    warnings = []
    tasks = submissions(course, warn=warnings.append)
    assert {t.key: tag_of(t.path) for t in tasks} == {f"ada/{CHAPTER}": "new", f"ben/{CHAPTER}": "ben",
                                                      f"cleo/{CHAPTER}": "cleo"}
    assert len(warnings) == 3 and any("'dan'" in w and "2 notebooks" in w for w in warnings), warnings


# ------------------------------------------------------------------ Unicode ids through the whole pipeline
UNICODE_CLASS = {"Zoë_李": "ada", "ana maría": "ben", "O'Brien & <Co>": "ada"}  # id -> whose sample work


@pytest.mark.pipeline
def test_unicode_student_ids_through_grading_feedback_exports_and_reports(tmp_path, released_class):
    """Three collected students with Unicode ids (two hand in the same correct work) graded by
    grade-class: the gradebook, CSVs, feedback pages, class report, similarity report and an LMS
    export all name them as typed."""
    course = new_course(tmp_path, released_class, students=set())
    download = tmp_path / "download"
    for student, whose in UNICODE_CLASS.items():
        put(download / f"{student}.ipynb", (released_class / "submitted" / whose / CHAPTER / f"{CHAPTER}.ipynb")
            .read_text(encoding="utf-8"))
    cli("collect", str(download), "--course", str(course))
    proc = cli("grade-class", "--course", str(course), "--workers", "2")
    assert "3 graded, 0 could not be graded" in proc.stdout, proc.stdout + proc.stderr
    with open(course / "class-grades.csv", encoding="utf-8") as f:
        totals = {row["student"]: float(row["total"]) for row in csv.DictReader(f)}
    assert totals == {"Zoë_李": 10.0, "ana maría": 5.0, "O'Brien & <Co>": 10.0}
    with open(course / "class-exercises.csv", encoding="utf-8") as f:
        assert {row["student"] for row in csv.DictReader(f)} == set(UNICODE_CLASS)
    from coursekit.nbgrader_course import gradebook
    with gradebook(course) as gb:
        assert {s.id for s in gb.students} == set(UNICODE_CLASS)
        assert {s.student.id: s.score for s in gb.assignment_submissions(CHAPTER)} == totals
    for student in UNICODE_CLASS:
        page = (course / "feedback" / student / CHAPTER / f"{CHAPTER}.html").read_text(encoding="utf-8")
        assert "BEGIN HIDDEN" not in page and "Score" in page
    report = (course / "class-report.html").read_text(encoding="utf-8")
    assert "Zoë_李" in report and "ana maría" in report and "&amp; &lt;Co&gt;" in report and "<Co>" not in report
    with open(course / "class-similarity.csv", encoding="utf-8") as f:
        pairs = {frozenset((row["a"], row["b"])) for row in csv.DictReader(f)}
    assert frozenset(("Zoë_李", "O'Brien & <Co>")) in pairs
    assert "<Co>" not in (course / "class-similarity.html").read_text(encoding="utf-8")
    ids = tmp_path / "ids.csv"
    ids.write_text("student,ID,Student\n" + "".join(f'"{s}",{1000 + i},"{s}"\n' for i, s in enumerate(UNICODE_CLASS)),
                   encoding="utf-8")
    cli("export", "--course", str(course), "--format", "canvas", "--students", str(ids))
    with open(course / "canvas-grades.csv", encoding="utf-8") as f:
        rows = {row["Student"]: row[CHAPTER] for row in csv.DictReader(f) if row["Student"] != "Points Possible"}
    assert rows == {"Zoë_李": "10", "ana maría": "5", "O'Brien & <Co>": "10"}
