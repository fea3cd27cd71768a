"""A hidden test's calls run in this process, by the kernel's own routine (``sandboxed.probe.call_one``).

For the grader's tools on trusted code only (the reference and its mutants in the mutation
benchmark, the protocol tests, the in-process tier of the course's own catalogs), never for
a submission: those run in the sandboxed kernel. Each call goes the whole way the wire goes,
in memory: encoded as the grader encodes it (``wire.encode_call``), through JSON and an
``.npz``, called by ``call_one``, and its result back through JSON and an ``.npz``, decoded as
the grader decodes it (``wire.decode_result``). So what the judge reads here is what it
would read from the kernel.
"""
from __future__ import annotations

import io
import json
import weakref

import numpy as np

from .sandboxed import probe as kernel_side
from .sandboxed import wire

_SOURCES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # hidden tests -> {key: source}


def _source(hidden, kind, names):
    cache = _SOURCES.setdefault(hidden, {})
    key = (kind, names)
    if key not in cache:
        cache[key] = hidden.model_source(names) if kind == "model" else hidden.dependency_source(list(names))
    return cache[key]


def _through_npz(arrays: dict) -> dict:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def encode_calls(probes, hidden, substituted=None, time_limit=None) -> tuple[list[dict], dict]:
    """The calls (and their arrays) as the grader writes them for the kernel.

    substituted: the dependencies whose reference stands in (``GradingSession._deps``: those
    whose own tests have run); default every probe's ``deps``.
    """
    arrays: dict = {}
    calls = []
    for index, probe in enumerate(probes):
        names = [d for d in probe.deps if substituted is None or d in substituted]
        deps = {"names": names, "source": _source(hidden, "deps", tuple(names))} if names else {}
        call = wire.encode_call(index, probe, deps, arrays, lambda name: _source(hidden, "model", name))
        if time_limit is not None:
            call["time_limit"] = time_limit
        calls.append(call)
    return calls, arrays


def run_probes(probes, ns: dict, hidden, substituted=None, time_limit=None) -> list[dict]:
    """Results of calling the code in ``ns`` on ``probes``, decoded as the judge reads them.

    As in the kernel (``attn_probe.run``), a call that runs out of time ends the test: the
    calls after it are not run (the list is shorter).
    """
    calls, arrays = encode_calls(probes, hidden, substituted, time_limit)
    calls, arrays = json.loads(json.dumps(calls)), _through_npz(arrays)
    writer, results = wire.Writer("r"), []
    for call in calls:
        outcome = kernel_side.call_one(call, arrays, ns, writer)
        results.append(outcome)
        if outcome["status"] == "timeout":
            break
    results, back = json.loads(json.dumps(results)), _through_npz(writer.arrays)
    return [wire.decode_result(r, back) for r in results]


def run_probe(probe, ns: dict, hidden, substituted=None, time_limit=None) -> dict:
    """One probe's result (``run_probes`` of one)."""
    return run_probes([probe], ns, hidden, substituted, time_limit)[0]
