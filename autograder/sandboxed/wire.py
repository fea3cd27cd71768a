"""The hidden tests' wire format, both directions: plain JSON plus named arrays, nothing executable.

Grader -> kernel, one **call** per probe (``encode_call``): its target, how to build it, and
its arguments, each value encoded as

* ``{"t": key}``: a tensor, stored under ``key`` in the arrays (``.npz``);
* ``{"v": value}``: a plain JSON value;
* ``{"d": {name: value}}``: a dict of encoded values; a list stays a list of encoded values;
* ``{"m": {"handle", "tree"}}``: a model argument (``ModelArg``): a tree of its parameters and
  buffers by name (tensors in the arrays), built in the kernel as a stand-in whose methods the
  grader answers (``standin``): no line of the reference crosses.

Kernel -> grader, one **result** per probe: ``{"status": "ok" | "error" | "timeout" | "missing",
...}``, its returned values described by ``{"kind": ...}`` (``Writer``): ``tensor`` (data in
the arrays), ``tuple``/``list``, ``module`` (its state dict), or only named (``tensor-subclass``,
``tensor-too-large``, ``python``, ``other``). The grader decodes them (``decode_result``)
without executing anything (``allow_pickle=False``; what is not a plain tensor is described).

Imported as ``autograder.sandboxed.wire`` by the grader and as ``attn_wire`` in the kernel:
only the standard library, numpy and torch.
"""
import copy
import dataclasses

import numpy as np
import torch

MAX_ELEMENTS = 2_000_000  # a returned tensor larger than this is not copied back


# ------------------------------------------------------------------ grader -> kernel: calls

@dataclasses.dataclass
class ModelArg:
    """A module argument: the reference class ``name`` with given parameters; in the kernel, a stand-in."""
    name: str
    init: dict
    state: dict  # parameter name -> tensor
    dtype: "str | None"
    module: torch.nn.Module  # the reference-built module (copied for every use in the judge)

    def fresh(self) -> torch.nn.Module:
        return copy.deepcopy(self.module)


def encode_call(index: int, probe, deps: dict, arrays: dict, describe_model=None, standins=None) -> dict:
    """One probe as the kernel reads it (``attn_probe``); its tensors go into ``arrays``.

    describe_model: ``(module, put) -> tree``, a model argument as a stand-in tree whose tensors
    ``put`` stores (``autograder.standins.describe``); its handle is ``m<probe>.<n>``, the n-th
    model argument of the probe (``standins.model_arguments``). standins: the address of the
    stand-in socket, for a call with dependencies or model arguments.
    """
    models = []

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
            models.append(value)
            return {"m": {"handle": f"m{index}.{len(models) - 1}",
                          "tree": describe_model(value.module, lambda t: enc(t)["t"])}}
        return {"v": value}
    args = [enc(a) for a in probe.args]
    kwargs = {k: enc(v) for k, v in probe.kwargs.items()}
    return {
        "standins": standins if (deps or models) else None,
        "target": probe.target,
        "args": args,
        "kwargs": kwargs,
        "init": probe.init,
        "state": {k: enc(v)["t"] for k, v in (probe.state or {}).items()},
        "grad_args": list(probe.grad_args),
        "cotangents": [enc(c)["t"] for c in probe.cotangents],
        "deps": deps,
        "method": probe.method,
        "dtype": probe.dtype,
        "time_limit": probe.call_limit(),
        "train": False if probe.init is not None else None,
        "expects_error": bool(getattr(probe, "raises", ())),
    }


def tensor(arrays, ref):
    """Kernel side: the tensor stored under ``ref``."""
    return torch.from_numpy(np.array(arrays[ref]))


def decode_value(value, arrays, build_model):
    """Kernel side: an encoded argument; ``build_model(description, arrays)`` makes a model argument."""
    if isinstance(value, dict) and "t" in value:
        return tensor(arrays, value["t"])
    if isinstance(value, dict) and "v" in value:
        return value["v"]
    if isinstance(value, dict) and "d" in value:
        return {k: decode_value(v, arrays, build_model) for k, v in value["d"].items()}
    if isinstance(value, dict) and "m" in value:
        return build_model(value["m"], arrays)
    if isinstance(value, list):
        return [decode_value(v, arrays, build_model) for v in value]
    return value


def has_model_argument(call) -> bool:
    return any(isinstance(a, dict) and "m" in a for a in (*call["args"], *call["kwargs"].values()))


# ------------------------------------------------------------------ kernel -> grader: results

class Writer:
    """Kernel side: describes returned values; their tensors go to ``arrays`` (saved as ``.npz``)."""

    def __init__(self, prefix):
        self.prefix, self.arrays = prefix, {}

    def put(self, value):
        """Describe one returned value; tensors go to the array store."""
        if type(value) is torch.Tensor or type(value) is torch.nn.Parameter:
            if value.numel() > MAX_ELEMENTS:
                return {"kind": "tensor-too-large", "shape": list(value.shape)}
            key = f"{self.prefix}{len(self.arrays)}"
            data = value.detach().cpu().resolve_conj().resolve_neg().contiguous()
            self.arrays[key] = data.numpy().copy()
            return {"kind": "tensor", "ref": key, "dtype": str(data.dtype).replace("torch.", ""),
                    "requires_grad": bool(value.requires_grad)}
        if isinstance(value, torch.Tensor):
            return {"kind": "tensor-subclass", "type": type(value).__name__}
        if isinstance(value, torch.nn.Module):
            return {"kind": "module", "type": type(value).__name__,
                    "state": {k: self.put(v) for k, v in value.state_dict().items()}}
        if isinstance(value, (tuple, list)):
            return {"kind": type(value).__name__, "items": [self.put(v) for v in value]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"kind": "python", "type": type(value).__name__}
        return {"kind": "other", "type": type(value).__name__}


class ModuleState:
    """A module as the judge sees it: its class name and its state dict (parameters and buffers)."""

    def __init__(self, type_name: str, state: dict):
        self.type_name, self.state = type_name, state
        self.description = f"a {type_name} module"

    @classmethod
    def of(cls, module: torch.nn.Module) -> "ModuleState":
        return cls(type(module).__name__, {k: v.detach().clone() for k, v in module.state_dict().items()})


class Foreign:
    """A returned value that is not a plain tensor (described, never executed)."""

    def __init__(self, description):
        self.description = description

    def __repr__(self):
        return self.description


def decode_value_described(desc, arrays):
    """Grader side: a returned value from its ``{"kind": ...}`` description."""
    kind = desc.get("kind") if isinstance(desc, dict) else None
    if kind == "tensor":
        value = torch.from_numpy(np.array(arrays[desc["ref"]], copy=True))
        if str(value.dtype).replace("torch.", "") != desc.get("dtype"):
            return Foreign("a tensor whose data could not be read back")
        return value
    if kind in ("tuple", "list"):
        return tuple(decode_value_described(d, arrays) for d in desc["items"])
    if kind == "module":
        state = {k: decode_value_described(v, arrays) for k, v in desc.get("state", {}).items()}
        if not all(isinstance(v, torch.Tensor) for v in state.values()):
            return Foreign(f"a {desc.get('type', 'module')} module whose state could not be read back")
        return ModuleState(str(desc.get("type", "module")), state)
    if kind == "tensor-subclass":
        return Foreign(f"a tensor subclass ({desc.get('type')}); return a plain torch.Tensor")
    if kind == "tensor-too-large":
        return Foreign(f"a tensor of shape {tuple(desc.get('shape', ()))}")
    return Foreign(f"a {desc.get('type', 'value')}" if isinstance(desc, dict) else "an unreadable value")


def decode_result(result, arrays):
    """Grader side: one probe's result as the judge reads it (``value``, ``grads``, ``inputs_after``)."""
    result = dict(result)
    if result.get("status") == "error":  # plain strings only, whatever the kernel wrote
        result["error"] = str(result.get("error", ""))[:2000]
        if "error_message" in result:
            result["error_message"] = str(result["error_message"])[:1000]
    if result.get("status") == "ok":
        result["value"] = decode_value_described(result.get("output"), arrays)
        grads = {k: decode_value_described(v, arrays) for k, v in result.get("grads", {}).items()}
        result["grads"] = {k: v for k, v in grads.items() if isinstance(v, torch.Tensor)}
        result["inputs_after"] = [None if d is None else decode_value_described(d, arrays)
                                  for d in result.get("inputs_after", [])]
    return result
