"""Gradescope: the autograder zip of a chapter, and what it runs for each submission.

``build`` writes ``<chapter>-gradescope.zip``: ``setup.sh`` and ``run_autograder`` at its root (as
Gradescope asks) and ``grader/``, the grader with the chapter's hidden material (``bundle``).
Gradescope unpacks it into ``/autograder/source``; ``run_autograder`` runs ``python -m
autograder.platforms.gradescope run``, which grades the notebook in ``/autograder/submission``
and writes ``/autograder/results/results.json`` as Gradescope's specification says
(https://gradescope-autograders.readthedocs.io/en/latest/specs/; checked against
``schemas/gradescope_results.schema.json``). The root comes from ``ATTN_GRADESCOPE_ROOT``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from coursekit import conventions as C

from ..messages import msg, tell
from . import bundle

ROOT_VARIABLE = "ATTN_GRADESCOPE_ROOT"
TEMPLATES = Path(__file__).with_name("templates")
SCHEMA = Path(__file__).with_name("schemas") / "gradescope_results.schema.json"
OUTPUT_CAP = 20_000  # characters of one test's output: a named mistake takes a line or two


def build(chapter: str, out: Path) -> Path:
    """OUT/<chapter>-gradescope.zip, the autograder to upload for CHAPTER."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{chapter}-gradescope.zip"
    with tempfile.TemporaryDirectory() as tmp:
        grader = bundle.write_grader([chapter], Path(tmp) / "grader")
        with zipfile.ZipFile(target.with_suffix(".part"), "w", zipfile.ZIP_DEFLATED) as zf:
            for name, inside in (("gradescope_setup.sh", "setup.sh"), ("gradescope_run_autograder", "run_autograder")):
                _add(zf, TEMPLATES / name, inside, 0o755)
            for path in sorted(grader.rglob("*")):
                if path.is_file():
                    _add(zf, path, f"grader/{path.relative_to(grader).as_posix()}", 0o644)
    target.with_suffix(".part").replace(target)
    return target


def _add(zf: zipfile.ZipFile, path: Path, name: str, mode: int) -> None:
    info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))  # the same zip from the same course
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, path.read_bytes())


def _capped(text: str) -> str:
    return text if len(text) <= OUTPUT_CAP else text[:OUTPUT_CAP] + "\n[... cut]"


def _plain_md(text: str) -> str:
    """TEXT shown as itself in Gradescope's Markdown (no HTML, no emphasis from a learner's names)."""
    for ch in "\\`*_[]<>#|":
        text = text.replace(ch, "\\" + ch)
    return text


def results(graded: bundle.Graded) -> dict:
    """Gradescope's results.json for one graded (or refused) submission."""
    data = {"score": 0.0, "execution_time": max(0, round(graded.seconds)), "output_format": "md",
            "test_output_format": "text", "test_name_format": "text", "visibility": "visible",
            "stdout_visibility": "hidden", "extra_data": {"chapter": graded.chapter, "isolation": graded.isolation}}
    report = graded.report
    if report is None:
        why = graded.refused or ("The grader failed on this submission, so it was not graded; submit it again "
                                 "or ask your instructor (the grader's log names the failure).")
        data.update(output=f"**{graded.chapter}: not graded.** {_plain_md(why)}", tests=[])
        if graded.failed:
            data["extra_data"]["failed"] = graded.failed
        return data
    summary = report.as_json()
    score, max_score = f"{summary['score']:g}", f"{summary['max_score']:g}"
    head = tell(msg("{notebook}: {score} / {max_score} points", notebook=summary["notebook"], score=score,
                    max_score=max_score), report.language)
    paragraphs = [f"**{_plain_md(head)}**"]  # Markdown paragraphs, as the text report words them
    by_hand = summary.get("by_hand")
    if by_hand:
        items = [_plain_md(tell(msg("written answers, graded by hand (not in the score above):"), report.language))]
        for grade_id, answer in by_hand["answers"].items():
            points = f"{answer['max_score']:g}"
            told = tell(msg("to be graded by hand ({points} points)", points=points) if answer["answered"] else
                        msg("not answered (the cell still holds its prompt): 0 / {points}", points=points),
                        report.language)
            items.append(f"- {_plain_md(grade_id)}: {_plain_md(told)}")
        paragraphs.append("\n".join(items))
    if report.repairs:
        paragraphs.append(_plain_md(tell(msg("repaired before grading: {notes}",
                                             notes="; ".join(tell(r, report.language) for r in report.repairs)),
                                         report.language)))
    tests = []
    for number, outcome in enumerate(report.outcomes, 1):
        told = [tell(p, report.language) for p in outcome.problems] or [tell(msg("passed"), report.language)]
        tests.append({"name": outcome.test_id, "number": str(number), "score": float(outcome.score),
                      "max_score": float(outcome.points),
                      "status": "passed" if outcome.score >= outcome.points else "failed",
                      "output": _capped("\n".join(told)), "tags": [outcome.exercise], "visibility": "visible"})
    data.update(score=float(summary["score"]), output="\n\n".join(paragraphs), tests=tests)
    return data


def run(root: Path) -> dict:
    """Grade ROOT/submission, write ROOT/results/results.json; return it."""
    chapter = bundle.packaged_chapters(C.ROOT)[0]
    # Without bubblewrap the audit hook also denies these (the grader's own folder always).
    private = (root / "source", root / "results", root / "submission_metadata.json")
    graded = bundle.grade_one(root / "submission", chapter, private,
                              os.environ.get(bundle.ISOLATION_VARIABLE, "auto"))
    data = results(graded)
    # its log: Gradescope shows run_autograder's output to instructors only
    bundle.write_results(root / "results", data, graded, f"score {data['score']:g}")
    return data


def check(root: Path) -> None:
    """setup.sh's checks: the grader imports, its chapter's hidden tests load, its scratch course is
    built (the one-time work of every run), and which isolation this image gives."""
    chapter = bundle.packaged_chapters(C.ROOT)[0]
    how = bundle.warm(C.ROOT)
    if not (root / "source" / "grader").is_dir():
        raise SystemExit(f"{root}/source/grader: not here; unpack the zip into {root}/source")
    print(f"{chapter}: grader ready; kernels will be isolated by {how}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.platforms.gradescope")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, what in (("run", "grade ROOT/submission (run_autograder)"), ("check", "setup.sh's checks")):
        one = sub.add_parser(name, help=what)
        one.add_argument("--root", type=Path, default=Path(os.environ.get(ROOT_VARIABLE, "/autograder")))
    write = sub.add_parser("build", help="write the autograder zip of each chapter")
    write.add_argument("chapters", nargs="*", help="chapters (default: all)")
    write.add_argument("--out", type=Path, required=True, help="folder to write into")
    args = parser.parse_args(argv)
    if args.command == "build":  # python -m autograder gradescope (platforms.commands) does the same
        try:
            for chapter in args.chapters or [c for c in C.chapter_names() if C.instructor_notebook(c).exists()]:
                print(build(chapter, args.out))
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    import warnings
    warnings.filterwarnings("ignore")  # nbgrader's SQLAlchemy chatter is not for the log
    (run if args.command == "run" else check)(args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
