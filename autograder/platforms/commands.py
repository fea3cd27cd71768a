"""The commands that write a platform's package: ``python -m autograder gradescope|prairielearn
[CHAPTER ...] --out DIR`` (also ``python -m autograder.platforms.gradescope build ...``)."""
from __future__ import annotations

import sys
from pathlib import Path

PLATFORMS = {"gradescope": "a Gradescope autograder zip per chapter",
             "prairielearn": "a PrairieLearn grader image (Dockerfile) and a question per chapter"}


def add_commands(sub) -> None:
    """The platforms' subcommands, on the command line's subparsers (each runs ``args.run(args)``)."""
    for name, what in PLATFORMS.items():
        one = sub.add_parser(name, help=f"write {what}")
        add_build_arguments(one)
        if name == "prairielearn":
            one.add_argument("--image", default="attention-from-scratch/grader",
                             help="the grader image's name in each question's info.json")
        one.set_defaults(run=run_build, platform=name)


def add_build_arguments(parser) -> None:
    parser.add_argument("chapters", nargs="*", help="chapters (default: all)")
    parser.add_argument("--out", type=Path, required=True, help="folder to write into")


def run_build(args) -> int:
    from coursekit import conventions as C
    names = [c for c in C.chapter_names() if C.instructor_notebook(c).exists()]
    unknown = [c for c in args.chapters if c not in names]
    if unknown:
        print(f"error: unknown chapter(s): {', '.join(unknown)} (known: {', '.join(names)})", file=sys.stderr)
        return 2
    if args.platform == "gradescope":
        from .gradescope import build
        paths = [build(chapter, args.out) for chapter in args.chapters or names]
    else:
        from .prairielearn import build
        paths = build(args.chapters or names, args.out, args.image)
    for path in paths:
        print(path)
    return 0
