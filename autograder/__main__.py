"""Command line.

    python -m autograder grade NOTEBOOK.ipynb [--json]          one submission
    python -m autograder release|collect|grade-class|merge|export  a whole class
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
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
    rel = sub.add_parser("release", help="generate learner notebooks (nbgrader generate_assignment)")
    rel.add_argument("chapters", nargs="*", help="chapters (default: all)")
    rel.add_argument("--course", type=Path, required=True, help="nbgrader course folder")
    rel.add_argument("--to", type=Path, help="also copy the learner notebooks into this plain folder")
    col = sub.add_parser("collect", help="copy submissions into COURSE/submitted/<student>/<chapter>/")
    col.add_argument("source", type=Path, help="nbgrader submitted/ tree or a flat folder of <student>.ipynb")
    col.add_argument("--course", type=Path, required=True)
    col.add_argument("--chapter", help="chapter of a flat folder (default: each notebook's metadata)")
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
    mer = sub.add_parser("merge", help="combine shard results into one gradebook and CSVs")
    mer.add_argument("shards", nargs="+", type=Path)
    mer.add_argument("--into", type=Path, required=True)
    exp = sub.add_parser("export", help="write grades.csv and exercises.csv")
    exp.add_argument("--course", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command != "grade":
        return _class_command(args)

    import warnings
    warnings.filterwarnings("ignore")  # nbgrader's SQLAlchemy chatter is not for the reader
    from .grading import grade
    from .sandbox import SandboxUnavailable
    from .submission import SubmissionError
    try:
        report = grade(args.notebook, student=args.student, feedback_dir=args.feedback_dir,
                       chapter=args.chapter, sandboxed=not args.unsandboxed)
    except (SubmissionError, SandboxUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        print(f"error: grading failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
              file=sys.stderr)
        return 1
    print(json.dumps(report.as_json()) if args.json else report.as_text())
    return 0


def _class_command(args) -> int:
    import warnings
    warnings.filterwarnings("ignore")
    from . import classroom
    from .chapters import known
    from .collect import collect
    from .export import export
    from .release import release
    from .sandbox import SandboxUnavailable
    chapters = known()
    try:
        if args.command == "release":
            unknown = [c for c in args.chapters if c not in chapters]
            if unknown:
                raise ValueError(f"unknown chapter(s): {', '.join(unknown)}")
            for path in release(args.course, [chapters[c] for c in args.chapters or chapters], args.to):
                print(path)
        elif args.command == "collect":
            tasks = collect(args.source, args.course, args.chapter)
            print(f"collected {len(tasks)} submission(s) into {args.course / 'submitted'}")
        elif args.command == "grade-class":
            shard = None
            if args.shard:
                index, _, count = args.shard.partition("/")
                shard = (int(index), int(count))
                if not 1 <= shard[0] <= shard[1]:
                    raise ValueError("--shard takes I/N with 1 <= I <= N")
            summary = classroom.grade_class(args.course, args.chapter, args.workers, args.force, shard,
                                            args.out, args.timeout, sandboxed=not args.unsandboxed)
            out = args.out or args.course
            print(f"{summary['graded']} graded, {summary['failed']} could not be graded, "
                  f"{summary['skipped']} already graded; gradebook {out / 'gradebook.db'}, "
                  f"{out / 'grades.csv'}, {out / 'exercises.csv'}, feedback in {out / 'feedback'}")
        elif args.command == "merge":
            count = classroom.merge(args.into, args.shards)
            print(f"merged {count} submission(s) into {args.into}")
        elif args.command == "export":
            for path in export(args.course):
                print(path)
    except KeyboardInterrupt:
        return 130
    except (ValueError, RuntimeError, OSError, SandboxUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
