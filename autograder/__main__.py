"""Command line.

    python -m autograder grade NOTEBOOK.ipynb [--json]          one submission
    python -m autograder release|collect|grade-class|merge|export|report  a whole class
    python -m autograder gradescope|prairielearn [CHAPTER ...] --out DIR   a platform's package
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from coursekit.conventions import EDITIONS


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    return args.run(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder")
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("grade", help="grade one submitted notebook")
    one.add_argument("notebook", type=Path)
    one.add_argument("--json", action="store_true", help="print the result as one JSON object")
    one.add_argument("--student", default="student", help="student id for the gradebook")
    one.add_argument("--chapter", help="chapter name, when neither file name nor metadata tell")
    one.add_argument("--feedback-dir", type=Path, help="also write the HTML feedback here")
    one.add_argument("--unsandboxed", action="store_true",
                     help="run the kernel without the OS sandbox (only for code you trust)")
    one.set_defaults(run=_grade)
    rel = sub.add_parser("release", help="generate learner notebooks (nbgrader generate_assignment)")
    rel.add_argument("chapters", nargs="*", help="chapters (default: all)")
    rel.add_argument("--course", type=Path, required=True, help="nbgrader course folder")
    rel.add_argument("--to", type=Path, help="also copy the learner notebooks into this plain folder")
    rel.add_argument("--language", default=EDITIONS[0], choices=EDITIONS,
                     help="the edition to hand out (grade ids and hidden tests are the same in every edition)")
    rel.add_argument("--due", action="append", default=[], metavar="CHAPTER=YYYY-MM-DDTHH:MM[+HH:MM]",
                     help="a chapter's due date (nbgrader's Assignment.duedate; no zone: UTC); repeatable")
    rel.add_argument("--late", metavar="POLICY",
                     help="late policy: none, zero (a late submission scores 0), P/hour or P/day (P points "
                          "off per started hour or day late); written into COURSE/nbgrader_config.py")
    rel.set_defaults(run=_class_command, step=_release)
    col = sub.add_parser("collect", help="copy submissions into COURSE/submitted/<student>/<chapter>/")
    col.add_argument("source", type=Path, help="nbgrader submitted/ tree or a flat folder of <student>.ipynb")
    col.add_argument("--course", type=Path, required=True)
    col.add_argument("--chapter", help="chapter of a flat folder (default: each notebook's metadata)")
    col.set_defaults(run=_class_command, step=_collect)
    cls = sub.add_parser("grade-class", help="grade every submission in parallel")
    cls.add_argument("--course", type=Path, required=True)
    cls.add_argument("--chapter", action="append", help="only these chapters (repeatable)")
    cls.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    cls.add_argument("--force", action="store_true", help="regrade submissions already graded")
    cls.add_argument("--shard", help="I/N: grade a deterministic 1/N of the submissions (1-based I)")
    cls.add_argument("--out", type=Path, help="results folder (default: the course; use one per shard)")
    cls.add_argument("--timeout", type=float, default=900, help="seconds one submission may take")
    cls.add_argument("--unsandboxed", action="store_true",
                     help="run kernels without the OS sandbox (only for code you trust)")
    cls.set_defaults(run=_class_command, step=_grade_class)
    mer = sub.add_parser("merge", help="combine shard results into one gradebook and CSVs")
    mer.add_argument("shards", nargs="+", type=Path)
    mer.add_argument("--into", type=Path, required=True)
    mer.set_defaults(run=_class_command, step=_merge)
    exp = sub.add_parser("export", help="write class-grades.csv and class-exercises.csv, or an LMS's grades")
    exp.add_argument("--course", type=Path, required=True)
    exp.add_argument("--format", choices=("csv", "canvas", "moodle"), default="csv",
                     help="csv: the class CSVs; canvas/moodle: that LMS's gradebook import CSV")
    exp.add_argument("--students", type=Path,
                     help="CSV mapping the course's student ids (column 'student') to the LMS's")
    exp.add_argument("--assignment-id", action="append", default=[], metavar="CHAPTER=ID",
                     help="Canvas assignment id of a chapter (column 'CHAPTER (ID)'); repeatable")
    exp.add_argument("--out", type=Path, help="the LMS file (default COURSE/canvas-grades.csv or moodle-grades.csv)")
    exp.set_defaults(run=_class_command, step=_export)
    rep = sub.add_parser("report", help="write the class report and the similarity report")
    rep.add_argument("--course", type=Path, required=True, help="course folder or a results folder (--out)")
    rep.add_argument("--submitted", type=Path,
                     help="submitted/ folder for the answer cells (default COURSE/submitted)")
    rep.add_argument("--threshold", type=float, help="list pairs of answer cells at least this similar (0-1)")
    rep.set_defaults(run=_class_command, step=_report)
    from .platforms.commands import add_commands
    add_commands(sub)  # gradescope, prairielearn: a platform's package per chapter
    return parser


def _grade(args) -> int:
    """``grade``: one submission."""
    from .classroom.folders import student_id
    try:  # the gradebook's key and a part of the feedback page's name: checked before anything runs
        args.student = student_id(args.student, "--student")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    import warnings
    warnings.filterwarnings("ignore")  # nbgrader's SQLAlchemy chatter is not for the reader
    from .grading import grade
    from .sandbox import SandboxUnavailable
    from .submission import SubmissionError
    try:
        report = grade(args.notebook, student=args.student, feedback=args.feedback_dir is not None,
                       chapter=args.chapter, sandboxed=not args.unsandboxed)
    except (SubmissionError, SandboxUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        print(f"error: grading failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
              file=sys.stderr)
        return 1
    if args.feedback_dir is not None and report.feedback_page is not None:
        from .feedback import write_page
        report.feedback_html = write_page(args.feedback_dir, f"{args.student}-{report.chapter}.html",
                                          report.feedback_page)
    print(json.dumps(report.as_json()) if args.json else report.as_text())
    if report.limits_note():  # the instructor's log, not the report
        print(report.limits_note(), file=sys.stderr)
    return 0


def _class_command(args) -> int:
    """A class command: its chapters checked, then its step (``set_defaults(step=...)``); any error on one line."""
    import os
    import warnings
    warnings.filterwarnings("ignore")
    from coursekit.conventions import with_python_bin_on_path
    os.environ["PATH"] = with_python_bin_on_path()["PATH"]  # nbgrader's gradebook runs `alembic`
    try:
        _check_chapters(args)
        return args.step(args) or 0
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2


def _one_line(err: BaseException) -> str:
    """The reason for a failed class command, on one line."""
    from .classroom.folders import FolderError
    from .sandbox import SandboxUnavailable
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    if type(err).__module__.startswith("sqlalchemy"):
        first = str(getattr(err, "orig", None) or first).strip().splitlines()[0]
        return f"the gradebook cannot be opened ({first}); is gradebook.db an nbgrader gradebook?"
    if isinstance(err, (FolderError, SandboxUnavailable, ValueError, RuntimeError)):
        return first
    if isinstance(err, OSError) and err.filename:
        return f"{err.strerror or first}: {err.filename}"
    return f"{type(err).__name__}: {first}"


def _shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    index, slash, count = text.partition("/")
    if not (slash and index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise ValueError(f"--shard {text}: takes I/N with 1 <= I <= N, e.g. --shard 2/4")
    return int(index), int(count)


# Each class command checks its arguments before the heavy imports (nbformat, nbgrader), so that
# a mistake is reported at once.

def _check_chapters(args) -> None:
    from coursekit import conventions as C
    names = [c for c in C.chapter_names() if C.instructor_notebook(c).exists()]
    asked = getattr(args, "chapters", None) or getattr(args, "chapter", None) or []
    unknown = [c for c in ([asked] if isinstance(asked, str) else asked) if c not in names]
    if unknown:
        raise ValueError(f"unknown chapter(s): {', '.join(unknown)} (known: {', '.join(names)})")


def _release(args) -> None:
    from .classroom.folders import class_folder
    course = class_folder(args.course)
    plain = class_folder(args.to, "--to") if args.to else None
    from .chapters import known
    from .classroom import late
    from .classroom.release import release
    chapters = known()
    editions = [dataclasses.replace(chapters[c], language=args.language) for c in args.chapters or chapters]
    dues = [late.parse_due(item) for item in args.due]  # checked before anything is written
    for chapter, _ in dues:
        if chapter not in [e.name for e in editions]:
            raise ValueError(f"--due {chapter}: not a chapter this release hands out")
    if args.late:
        late.policy_lines(args.late)
    for path in release(course, editions, plain):
        print(path)
    for chapter, due in dues:
        late.set_due(course, chapter, due)
        print(f"{chapter}: due {due:%Y-%m-%d %H:%M} UTC")
    if args.late:
        late.set_policy(course, args.late)
        print(f"late policy: {args.late} ({course / 'nbgrader_config.py'})")


def _collect(args) -> None:
    from .classroom.folders import class_folder, existing_folder
    course = class_folder(args.course)
    if args.source.is_file():
        raise ValueError(f"collect: {args.source} is a file; unpack the LMS's download into a folder and "
                         "collect that folder")
    source = existing_folder(args.source, "collect: source")
    from .classroom.collect import LOG, collect
    outcomes = collect(source, course, args.chapter)
    for outcome in outcomes:
        print(outcome.line())
    counts = {a: sum(o.action == a for o in outcomes) for a in ("collected", "older", "unchanged", "refused")}
    if not any(o.task for o in outcomes):
        raise ValueError(f"collect: no submissions in {args.source} (expected <student>/<chapter>/*.ipynb "
                         "or a flat folder of <student>.ipynb; the lines above say why each file was left)")
    print(f"{counts['collected']} collected into {args.course / 'submitted'}, {counts['older']} kept as older "
          f"files, {counts['unchanged']} already there, {counts['refused']} refused; "
          f"these lines are also in {args.course / LOG}")


def _grade_class(args) -> None:
    from .classroom.export import CLASS_EXERCISES, CLASS_GRADES
    from .classroom.folders import class_folder
    shard = _shard(args.shard)
    course = class_folder(args.course)
    out = class_folder(args.out, "--out") if args.out else course
    if not (course / "submitted").is_dir():
        raise ValueError(f"--course {args.course}: no submitted/ folder to grade; run collect first")
    from .classroom.grade_class import grade_class
    summary = grade_class(course, args.chapter, args.workers, args.force, shard,
                          out, args.timeout, sandboxed=not args.unsandboxed)
    shown = args.out or args.course
    print(f"{summary['graded']} graded, {summary['failed']} could not be graded, "
          f"{summary['skipped']} already graded; gradebook {shown / 'gradebook.db'}, "
          f"{shown / CLASS_GRADES}, {shown / CLASS_EXERCISES}, feedback in {shown / 'feedback'}, "
          f"class report {shown / 'class-report.html'}")


def _merge(args) -> None:
    from .classroom.folders import class_folder, existing_folder
    into = class_folder(args.into, "--into")
    shards = [existing_folder(s, "merge: shard folder") for s in args.shards]
    for given, shard in zip(args.shards, shards):
        if not (shard / ".grading").is_dir():  # a shard may have had nothing to grade
            raise ValueError(f"merge: {given} is not a results folder of grade-class (no .grading/); "
                             "give the --out folders of grade-class")
    from .classroom.merge import merge
    count = merge(into, shards)
    print(f"merged {count} submission(s) into {args.into}; class report {args.into / 'class-report.html'}")


def _graded_course(args):
    """The class folder of ``export`` or ``report``, once something was graded in it."""
    from .classroom.folders import class_folder
    from .classroom.ledger import LEDGER
    course = class_folder(args.course)
    if not (course / LEDGER).is_file():
        raise ValueError(f"{args.command} --course {args.course}: nothing graded there yet (no {LEDGER}); "
                         "run grade-class first")
    return course


def _export(args) -> None:
    course = _graded_course(args)
    if args.format == "csv":
        from .classroom.export import export
        for path in export(course):
            print(path)
        return
    if args.students is None:
        raise ValueError(f"export --format {args.format}: give --students FILE.csv, mapping the course's "
                         "student ids (column 'student') to the LMS's")
    if not args.students.is_file():
        raise ValueError(f"--students {args.students}: no such file")
    from .classroom.lms import export_lms
    print(export_lms(course, args.format, args.students, args.out, _assignment_ids(args.assignment_id)))


def _assignment_ids(items) -> dict[str, str]:
    """chapter -> its LMS assignment id, from ``--assignment-id CHAPTER=ID``."""
    ids = {}
    for item in items:
        chapter, eq, number = item.partition("=")
        if not (eq and chapter and number):
            raise ValueError(f"--assignment-id {item}: takes CHAPTER=ID, e.g. 02_self_attention=1234")
        ids[chapter] = number
    return ids


def _report(args) -> None:
    course = _graded_course(args)
    if args.threshold is not None and not 0 < args.threshold <= 1:
        raise ValueError(f"--threshold {args.threshold}: takes a number in (0, 1]")
    submitted = args.submitted if args.submitted else course / "submitted"
    if args.submitted and not submitted.is_dir():
        raise ValueError(f"--submitted {args.submitted}: no such folder")
    from .classroom.class_report import write
    result = write(course, submitted, args.threshold)
    for path in result["files"]:
        print(path)


if __name__ == "__main__":
    sys.exit(main())
