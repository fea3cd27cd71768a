"""The files that cross the sandbox's boundary: a test's inputs out, the kernel's results back.

Inputs are written as one ``.npz`` of arrays and one ``.json`` of calls per test; results
come back the same way and are decoded without ever being executed. The format of both
is ``sandboxed.wire``; this module only writes, takes and reads the files. What a kernel left
is checked before it is decoded (``results_check``: bounded, and shaped as the kernel writes it).
"""
from __future__ import annotations

import json
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

from . import results_check
from .sandboxed import wire

MAX_RESULT_BYTES = 64 * 1024 * 1024


def write_inputs(folder: Path, test_id: str, calls: list[dict], arrays: dict) -> None:
    np.savez(folder / f"{test_id}.npz", **arrays)
    (folder / f"{test_id}.json").write_text(json.dumps({"test": test_id, "probes": calls}))


def take_results(exchange, private: Path, test_id: str) -> None:
    """Copy a test's result files out of the kernel's reach: regular files of bounded size only,
    read without following links or blocking (``Exchange.read_result``)."""
    for suffix in (".json", ".npz"):
        data = exchange.read_result(f"{test_id}{suffix}", MAX_RESULT_BYTES)
        if data is not None:
            (private / f"{test_id}{suffix}").write_bytes(data)


# What reading a missing, forged or oversized result can raise: each makes it "did not run".
UNREADABLE = (OSError, ValueError, EOFError, RecursionError, NotImplementedError, struct.error, zipfile.BadZipFile,
              zlib.error)


def read_results(private: Path, test_id: str) -> list[dict] | None:
    """The decoded results of one test, or None when it left none that can be read: no files, or
    files no honest kernel writes, or past a bound of what the grader decodes (``results_check``)."""
    try:
        results, refs = results_check.validated(results_check.parsed(private / f"{test_id}.json"), test_id)
        arrays = results_check.arrays(private / f"{test_id}.npz", refs)
    except UNREADABLE:  # results_check.Malformed is a ValueError
        return None
    return [wire.decode_result(r, arrays) for r in results]
