"""``python -m coursegen [--check] [CHAPTER ...]``: write or check the generated files."""
from __future__ import annotations

import argparse
import sys

from . import SourceError, chapters
from .build import artefacts, clean_stale, drift, write


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursegen", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="fail if any generated file differs from what its source gives")
    parser.add_argument("names", nargs="*", help="chapters to process (default: all)")
    args = parser.parse_args(argv)
    try:
        found = chapters()
    except SourceError as err:
        print(f"coursegen: {err}", file=sys.stderr)
        return 2
    selected = [c for c in found if not args.names or c.name in args.names]
    problems = []
    for chapter in selected:
        files = artefacts(chapter)
        if args.check:
            problems += drift(files)
        else:
            write(files)
            print(f"generated {chapter.name}: " + ", ".join(str(p) for p in files))
    if not args.check and not args.names:
        clean_stale(found)
    for problem in problems:
        print(f"drift: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
