"""PrairieLearn external grading: the grader image, a question per chapter, and the entry point.

``build`` writes ``grader-image/`` (a Dockerfile, the entry point ``attn-grade`` and ``grader/``,
the grader with the chapters' hidden material: ``bundle``) and ``questions/<qid>/`` for each
chapter (``info.json`` with external grading on, ``question.html`` with a download of the learner
notebook and a file upload, ``clientFilesQuestion/`` holding that notebook). In the job's
container the entry point runs ``python -m autograder.platforms.prairielearn run CHAPTER``: it
grades the notebook in ``/grade/student/`` and writes ``/grade/results/results.json`` as
PrairieLearn's documentation says (https://prairielearn.readthedocs.io/en/latest/externalGrading/;
checked against ``schemas/prairielearn_results.schema.json``): ``gradable: false`` for what is not
a notebook of the chapter (no attempt used), the file under PrairieLearn's 1 MB. The root comes
from ``ATTN_PRAIRIELEARN_ROOT``.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

from coursekit import conventions as C

from ..messages import msg, tell
from . import bundle

ROOT_VARIABLE = "ATTN_PRAIRIELEARN_ROOT"
TEMPLATES = Path(__file__).with_name("templates")
SCHEMA = Path(__file__).with_name("schemas") / "prairielearn_results.schema.json"
IMAGE = "attention-from-scratch/grader"  # the instructor's own Docker Hub name replaces it (--image)
ENTRY_POINT = "/usr/local/bin/attn-grade"
MAX_BYTES = 1_000_000  # "this file should be limited to 1 MB"
TIMEOUT = 600  # seconds: PrairieLearn's most; a chapter takes well under it, a looping one less than that
UUIDS = uuid.UUID("6d1b6c4e-5f0a-4c3e-9a57-2f0e6d0c5a11")  # question uuids: the same for a chapter every time


def question_id(chapter: str) -> str:
    return f"attention_from_scratch_{chapter}"


def _title(chapter: str) -> str:
    import nbformat
    nb = nbformat.read(C.learner_notebook(chapter), as_version=4)
    heading = next((line[2:].strip() for cell in nb.cells if cell.cell_type == "markdown"
                    for line in cell.source.splitlines() if line.startswith("# ")), chapter)
    return heading


def build(chapters: list[str], out: Path, image: str = IMAGE) -> list[Path]:
    """OUT/grader-image/ (the image's build folder) and OUT/questions/<qid>/ for each of CHAPTERS."""
    image_dir = out / "grader-image"
    if image_dir.exists():
        shutil.rmtree(image_dir)
    bundle.write_grader(chapters, image_dir / "grader")
    shutil.copy2(TEMPLATES / "prairielearn.Dockerfile", image_dir / "Dockerfile")
    shutil.copy2(TEMPLATES / "prairielearn_attn-grade", image_dir / "attn-grade")
    (image_dir / "attn-grade").chmod(0o755)
    written = [image_dir]
    for chapter in chapters:
        folder = out / "questions" / question_id(chapter)
        (folder / "clientFilesQuestion").mkdir(parents=True, exist_ok=True)
        shutil.copy2(C.learner_notebook(chapter), folder / "clientFilesQuestion" / f"{chapter}.ipynb")
        info = {"uuid": str(uuid.uuid5(UUIDS, chapter)), "title": _title(chapter), "topic": "Attention from Scratch",
                "tags": ["attention-from-scratch", chapter], "type": "v3", "singleVariant": True,
                "gradingMethod": "External",
                "externalGradingOptions": {"enabled": True, "image": image, "entrypoint": [ENTRY_POINT, chapter],
                                           "timeout": TIMEOUT}}
        (folder / "info.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n")
        page = (TEMPLATES / "prairielearn_question.html").read_text()
        (folder / "question.html").write_text(page.replace("{title}", html.escape(info["title"]))
                                              .replace("{chapter}", html.escape(chapter)))
        written.append(folder)
    return written


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n[... cut]"


def _within_limit(data: dict) -> dict:
    """DATA, its longest texts cut until its JSON is under MAX_BYTES (a named mistake is a line:
    only a submission's own printed output could be long, and none is shown)."""
    limit = 20_000
    while len(json.dumps(data, ensure_ascii=False).encode()) >= MAX_BYTES and limit > 100:
        data["output"] = _cut(data.get("output", ""), limit)
        for test in data.get("tests", []):
            test["output"], test["message"] = _cut(test["output"], limit // 10), _cut(test["message"], limit // 10)
        limit //= 2
    return data


def results(graded: bundle.Graded) -> dict:
    """PrairieLearn's results.json for one graded (or refused) submission."""
    report = graded.report
    if report is None:
        if graded.refused:
            return {"gradable": False, "message": f"Not graded (no attempt used): {graded.refused}",
                    "format_errors": [graded.refused], "output": "", "tests": []}
        return {"gradable": False, "format_errors": ["the grader failed on this submission"], "output": "",
                "message": "The grader failed on this submission, so it was not graded and costs no attempt; "
                           "submit it again or ask your instructor.", "tests": []}
    summary = report.as_json()
    language = report.language
    message = tell(msg("{notebook}: {score} / {max_score} points", notebook=summary["notebook"],
                       score=f"{summary['score']:g}", max_score=f"{summary['max_score']:g}"), language)
    by_hand = summary.get("by_hand")
    if by_hand:
        message += "; " + tell(msg("automatic: {score} / {max_score}; by hand: {pending} points pending",
                                   score=f"{summary['score']:g}", max_score=f"{summary['max_score']:g}",
                                   pending=f"{by_hand['pending']:g}"), language)
    tests = []
    for outcome in report.outcomes:
        told = [tell(p, language) for p in outcome.problems] or [tell(msg("passed"), language)]
        tests.append({"name": outcome.test_id, "description": outcome.exercise, "points": float(outcome.score),
                      "max_points": float(outcome.points), "message": told[0], "output": "\n".join(told)})
    score = summary["score"] / summary["max_score"] if summary["max_score"] else 0.0
    return _within_limit({"gradable": True, "score": min(1.0, max(0.0, score)), "message": message,
                          "output": report.as_text(), "tests": tests})


def run(root: Path, chapter: str) -> dict:
    """Grade ROOT/student as CHAPTER, write ROOT/results/results.json; return it."""
    if chapter not in bundle.packaged_chapters(C.ROOT):
        graded = bundle.Graded(chapter, "not graded", 0.0,
                               failed=f"this grader image holds {', '.join(bundle.packaged_chapters(C.ROOT))}, "
                                      f"not {chapter}: rebuild it with that chapter")
    else:
        # Without bubblewrap the audit hook also denies these (the grader's own folder always).
        private = (root / "tests", root / "serverFilesCourse", root / "data", root / "results")
        graded = bundle.grade_one(root / "student", chapter, private,
                                  os.environ.get(bundle.ISOLATION_VARIABLE, "auto"))
    data = results(graded)
    bundle.write_results(root / "results", data, graded,
                         f"gradable {data['gradable']}, score {data.get('score', 0):.3f}")
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.platforms.prairielearn")
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="grade ROOT/student as CHAPTER (the entry point)")
    one.add_argument("chapter")
    one.add_argument("--root", type=Path, default=Path(os.environ.get(ROOT_VARIABLE, "/grade")))
    sub.add_parser("check", help="the image's checks: the grader imports, each chapter's course is built")
    write = sub.add_parser("build", help="write the grader image's folder and a question per chapter")
    write.add_argument("chapters", nargs="*", help="chapters (default: all)")
    write.add_argument("--out", type=Path, required=True, help="folder to write into")
    write.add_argument("--image", default=IMAGE, help=f"the image's name in info.json (default {IMAGE})")
    args = parser.parse_args(argv)
    if args.command == "build":  # python -m autograder prairielearn (platforms.commands) does the same
        try:
            for path in build(args.chapters or [c for c in C.chapter_names() if C.instructor_notebook(c).exists()],
                              args.out, args.image):
                print(path)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    import warnings
    warnings.filterwarnings("ignore")  # nbgrader's SQLAlchemy chatter is not for the log
    if args.command == "check":
        how = bundle.warm(C.ROOT)
        print(f"{', '.join(bundle.packaged_chapters(C.ROOT))}: grader ready; kernels will be isolated by {how}")
    else:
        run(args.root, args.chapter)
    return 0


if __name__ == "__main__":
    sys.exit(main())
