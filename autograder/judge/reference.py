"""The reference's side of a probe: its result, computed once per probe and kept for the judge.

A probe's reference result (the value and the arguments after the call), its gradients and
each mistake model's result are computed the first time they are asked for and kept on the
probe; the builder (cotangent shapes, a probe that must raise) and every step of the judge
read the same ones.
"""
from __future__ import annotations

import torch

from ..sandboxed.wire import ModelArg, ModuleState


def float_tensor_indices(args):
    return tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point())


def as_tuple(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, ModelArg):
        return value.fresh()
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clone(v) for v in value)
    return value


def call_reference(probe, with_grad=False, keep_args=False):
    args = [clone(a) for a in probe.args]
    for i in probe.grad_args:
        args[i].requires_grad_(with_grad)
    kwargs = {k: clone(v) for k, v in probe.kwargs.items()}
    target = probe.reference
    if isinstance(target, torch.nn.Module):
        target.zero_grad(set_to_none=True)
        target = getattr(target, probe.method)
    out = target(*args, **kwargs)
    return (out, args) if with_grad or keep_args else out


def as_judged(value):
    """What the judge compares: modules by their state, everything else as it is."""
    if isinstance(value, torch.nn.Module):
        return ModuleState.of(value)
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple):
        return tuple(as_judged(v) for v in value)
    return value


_NOTHING = object()


def _kept(probe, key, compute):
    """``compute()`` once per probe (kept in ``probe.computed``, which a copied probe does not share)."""
    if probe.computed is None:
        probe.computed = {}
    if key not in probe.computed:
        try:
            probe.computed[key] = (compute(), None)
        except Exception as err:  # noqa: BLE001 - kept too: the same call raises the same way
            probe.computed[key] = (_NOTHING, err)
    value, err = probe.computed[key]
    if err is not None:
        raise err
    return value


def reference_call(probe):
    """(the reference's result as the judge compares it, the arguments after the call), no gradients."""
    def compute():
        out, args = call_reference(probe, keep_args=True)
        return as_judged(out), args
    return _kept(probe, "reference", compute)


def expected_value(probe):
    """The reference's result as the judge compares it."""
    return reference_call(probe)[0]


def expected_grads(probe) -> dict:
    """``{"arg<i>" | "param:<name>": gradient}`` of the reference for the probe's cotangents."""
    def compute():
        out, args = call_reference(probe, with_grad=True)
        outs = [o for o in as_tuple(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]
        loss = sum((o * c).sum() for o, c in zip(outs, probe.cotangents) if o.requires_grad)
        loss.backward()
        grads = {f"arg{i}": args[i].grad for i in probe.grad_args}
        if isinstance(probe.reference, torch.nn.Module):
            grads.update({f"param:{n}": p.grad for n, p in probe.reference.named_parameters()
                          if n in (probe.state or {})})
        return grads
    return _kept(probe, "grads", compute)


def mistake_result(probe, index):
    """What mistake model ``index`` of the probe returns, as the judge compares it (raises what it raises)."""
    def compute():
        mistake = probe.mistakes[index]
        return as_judged(mistake.compute(*([probe.reference] if isinstance(probe.reference, torch.nn.Module) else []),
                                         *[clone(a) for a in probe.args],
                                         **{k: clone(v) for k, v in probe.kwargs.items()}))
    return _kept(probe, ("mistake", index), compute)
