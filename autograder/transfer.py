"""What crosses the sandbox's boundary, as plain data: a test's inputs out, the kernel's results back.

Inputs are written as one ``.npz`` of arrays and one ``.json`` of call descriptions per
test; results come back the same way and are decoded here without ever being executed
(``allow_pickle=False``; a value that is not a plain tensor is only described).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

MAX_RESULT_BYTES = 64 * 1024 * 1024


def write_inputs(folder: Path, test_id: str, calls: list[dict], arrays: dict) -> None:
    np.savez(folder / f"{test_id}.npz", **arrays)
    (folder / f"{test_id}.json").write_text(json.dumps({"test": test_id, "probes": calls}))


def encode_call(index: int, probe, deps: dict, arrays: dict, model_source=None) -> dict:
    """One probe as the kernel reads it (``attn_probe``); its tensors go into ``arrays``.

    model_source: name -> source of a reference class, for model arguments (``hidden.ModelArg``).
    """
    from .hidden import ModelArg

    def enc(value):
        if isinstance(value, torch.Tensor):
            key = f"p{index}_{len(arrays)}"
            arrays[key] = value.detach().numpy()
            return {"t": key}
        if isinstance(value, (list, tuple)):
            return [enc(v) for v in value]
        if isinstance(value, dict):
            return {"d": {str(k): enc(v) for k, v in value.items()}}
        if isinstance(value, ModelArg):
            return {"m": {"name": value.name, "init": value.init, "dtype": value.dtype,
                          "source": model_source(value.name),
                          "state": {k: enc(v)["t"] for k, v in value.state.items()}}}
        return {"v": value}
    return {
        "target": probe.target,
        "args": [enc(a) for a in probe.args],
        "kwargs": {k: enc(v) for k, v in probe.kwargs.items()},
        "init": probe.init,
        "state": {k: enc(v)["t"] for k, v in (probe.state or {}).items()},
        "grad_args": list(probe.grad_args),
        "cotangents": [enc(c)["t"] for c in probe.cotangents],
        "deps": deps,
        "method": probe.method,
        "dtype": probe.dtype,
        "time_limit": probe.time_limit,
        "train": False if probe.init is not None else None,
        "expects_error": bool(getattr(probe, "raises", ())),
    }


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
        return [_decode_result(r, arrays) for r in meta["probes"]]
    except Exception:  # noqa: BLE001 - missing or forged files count as "did not run"
        return None


class Foreign:
    """A returned value that is not a plain tensor (described, never executed)."""

    def __init__(self, description):
        self.description = description

    def __repr__(self):
        return self.description


def _decode_value(desc, arrays):
    kind = desc.get("kind") if isinstance(desc, dict) else None
    if kind == "tensor":
        tensor = torch.from_numpy(np.array(arrays[desc["ref"]], copy=True))
        if str(tensor.dtype).replace("torch.", "") != desc.get("dtype"):
            return Foreign("a tensor whose data could not be read back")
        return tensor
    if kind in ("tuple", "list"):
        return tuple(_decode_value(d, arrays) for d in desc["items"])
    if kind == "module":
        from .hidden import ModuleState
        state = {k: _decode_value(v, arrays) for k, v in desc.get("state", {}).items()}
        if not all(isinstance(v, torch.Tensor) for v in state.values()):
            return Foreign(f"a {desc.get('type', 'module')} module whose state could not be read back")
        return ModuleState(str(desc.get("type", "module")), state)
    if kind == "tensor-subclass":
        return Foreign(f"a tensor subclass ({desc.get('type')}); return a plain torch.Tensor")
    if kind == "tensor-too-large":
        return Foreign(f"a tensor of shape {tuple(desc.get('shape', ()))}")
    return Foreign(f"a {desc.get('type', 'value')}" if isinstance(desc, dict) else "an unreadable value")


def _decode_result(result, arrays):
    result = dict(result)
    if result.get("status") == "error":  # plain strings only, whatever the kernel wrote
        result["error"] = str(result.get("error", ""))[:2000]
        if "error_message" in result:
            result["error_message"] = str(result["error_message"])[:1000]
    if result.get("status") == "ok":
        result["value"] = _decode_value(result.get("output"), arrays)
        grads = {k: _decode_value(v, arrays) for k, v in result.get("grads", {}).items()}
        result["grads"] = {k: v for k, v in grads.items() if isinstance(v, torch.Tensor)}
        result["inputs_after"] = [None if d is None else _decode_value(d, arrays)
                                  for d in result.get("inputs_after", [])]
    return result
