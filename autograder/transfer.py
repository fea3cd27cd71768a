"""The files that cross the sandbox's boundary: a test's inputs out, the kernel's results back.

Inputs are written as one ``.npz`` of arrays and one ``.json`` of calls per test; results
come back the same way and are decoded without ever being executed. The format of both
is ``sandboxed.wire``; this module only writes, takes and reads the files.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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


def read_results(private: Path, test_id: str) -> list[dict] | None:
    """The decoded results of one test, or None when it left none that can be read."""
    try:
        meta = json.loads((private / f"{test_id}.json").read_text())
        with np.load(private / f"{test_id}.npz", allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        return [wire.decode_result(r, arrays) for r in meta["probes"]]
    except Exception:  # noqa: BLE001 - missing or forged files count as "did not run"
        return None
