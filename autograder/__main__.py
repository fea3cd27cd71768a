"""Command line: ``python -m autograder grade NOTEBOOK.ipynb [--json]``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _text_report(report) -> str:
    data = report.as_json()
    lines = [f"{data['notebook']}: {data['score']:g} / {data['max_score']:g} points"]
    for name, ex in data["exercises"].items():
        lines.append(f"\n{name}: {ex['score']:g} / {ex['max_score']:g}")
        lines += [f"  {line}" for line in ex["feedback"]]
    if report.repairs:
        lines.append("\nrepaired before grading: " + "; ".join(report.repairs))
    if report.feedback_html:
        lines.append(f"\nfeedback: {report.feedback_html}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder")
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("grade", help="grade one submitted notebook")
    one.add_argument("notebook", type=Path)
    one.add_argument("--json", action="store_true", help="print the result as one JSON object")
    one.add_argument("--student", default="student", help="student id for the gradebook")
    one.add_argument("--chapter", help="chapter name, when neither file name nor metadata tell")
    one.add_argument("--feedback-dir", type=Path, help="also write the HTML feedback here")
    args = parser.parse_args(argv)

    import warnings
    warnings.filterwarnings("ignore")  # nbgrader's SQLAlchemy chatter is not for the reader
    from .grading import grade
    from .submission import SubmissionError
    try:
        report = grade(args.notebook, student=args.student, feedback_dir=args.feedback_dir,
                       chapter=args.chapter)
    except SubmissionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - one line, never a traceback
        print(f"error: grading failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
              file=sys.stderr)
        return 1
    print(json.dumps(report.as_json()) if args.json else _text_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
