"""Submissions the platform adapters' tests hand in (tests/test_gradescope.py, test_prairielearn.py),
and the platform's layout of one grading: the package unpacked into a fresh root per submission, as
each platform starts a fresh container per submission."""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import jsonschema
import nbformat

from support import reference_answers, submission

CHAPTER = "02_self_attention"
SCHEMAS = Path(__file__).resolve().parent.parent / "autograder" / "platforms" / "schemas"


def unscaled_answer() -> str:
    """The reference scaled_dot_product_attention with one named mistake: scores not scaled by 1/sqrt(d_k)."""
    answer = reference_answers(CHAPTER)["scaled_dot_product_attention"]
    assert " / math.sqrt(d_k)" in answer
    return answer.replace(" / math.sqrt(d_k)", "")


def tampering_answer(root: Path, hidden: str) -> str:
    """The unscaled answer, then what a submission would try in the platform's container, knowing its
    paths: read the reference (HIDDEN) and take its answer, write a full-marks results.json now, and
    leave a process that writes one after grading. Any of these that worked would show: full marks."""
    return unscaled_answer() + "\n\n" + textwrap.dedent(f"""
        import glob as _glob, json as _json, pathlib as _pathlib, subprocess as _subprocess
        _fake = _json.dumps({{"score": 1000.0, "gradable": True, "output": "tampered", "tests": []}})
        for _path in [{hidden!r}, *_glob.glob({str(root)!r} + "/**/ch02_self_attention.py", recursive=True)]:
            try:
                exec(compile(open(_path).read(), "stolen", "exec"))  # the reference's answer replaces this one
                break
            except Exception:
                pass
        for _path in _glob.glob({str(root)!r} + "/**/results", recursive=True) + [{str(root / "results")!r}]:
            try:
                _pathlib.Path(_path, "results.json").write_text(_fake)
            except Exception:
                pass
        try:
            _subprocess.Popen(["/bin/sh", "-c", "sleep 5; echo '" + _fake + "' > {root}/results/results.json"],
                              start_new_session=True)
        except Exception:
            pass
        """)


# The escape suite's cases that a platform run repeats (issue 50: "the attack catalog gains nothing
# through either adapter"): the catalog's fake probe module on the untouched notebook (must score 0)
# and test_escape_records' cheat, the built-in behind a helper with the recorder silenced (its
# from-scratch exercise's tests lost, "from scratch"). The catalog's other tricks name this
# checkout's paths (the reference where the repository has it), which a package does not have:
# tampering_answer tries the package's.
FROM_THE_ESCAPE_SUITE = ("catalog: fake probe module", "escape records: silenced recorder")


def submissions(root: Path, hidden: str) -> dict[str, nbformat.NotebookNode | bytes | None]:
    """name -> what is handed in: a notebook, raw bytes (an unreadable file) or None (nothing)."""
    from catalog import common_tampering
    from test_escape_records import cheat
    return {"full marks": submission(),
            "partly wrong": submission({"scaled_dot_product_attention": unscaled_answer()}),
            "tampering": submission({"scaled_dot_product_attention": tampering_answer(root, hidden)}),
            "empty file": b"",
            "nothing": None,
            "another chapter": submission(chapter="03_multi_head_attention"),
            FROM_THE_ESCAPE_SUITE[0]: common_tampering(CHAPTER)["fake_probe_module"],
            FROM_THE_ESCAPE_SUITE[1]: cheat(CHAPTER)}


def hand_in(folder: Path, handed, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(handed, bytes):
        (folder / name).write_bytes(handed)
    elif handed is not None:
        nbformat.write(handed, folder / name)


def validate(data: dict, schema: str) -> None:
    """DATA against the platform's schema (autograder/platforms/schemas/SCHEMA)."""
    jsonschema.Draft202012Validator(json.loads((SCHEMAS / schema).read_text())).validate(data)


def platform_env(**more: str) -> dict[str, str]:
    """The environment a platform's script runs with: this machine's, no grader settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTN_", "PYTHON"))}
    env.update(more)
    return env
