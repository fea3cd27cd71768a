"""Comparing a returned value with the reference's: tolerances, structure, which part differs."""
from __future__ import annotations

import torch

from ..messages import msg
from ..sandboxed.wire import ModuleState


FLOAT32_TOLERANCE = (2e-5, 1e-4)   # (atol, rtol)
FLOAT64_TOLERANCE = (1e-9, 1e-7)


def tolerance(dtype, strict=False):
    """(atol, rtol) for comparing a result of this dtype with the reference.

    Tolerances follow what the spec asks, not how the reference computes it. The spec
    asks float64 inputs to give float64 outputs (the dtype is checked exactly, in
    ``close``), never that every intermediate be float64: an implementation written
    the common way, e.g. RoPE angles computed in float32 and applied to a float64
    input, agrees to float32 precision and is correct. So float64 results are compared
    at float32 precision, unless the probe is ``strict`` (for an exercise whose spec
    text explicitly requires float64 precision; none does today).
    """
    if dtype == torch.float64 and strict:
        return FLOAT64_TOLERANCE
    return FLOAT32_TOLERANCE


def close(a, b, strict=False):
    """Same shape and dtype, values equal (exact for bool/int) or within ``tolerance``."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool or not a.is_floating_point():
        return torch.equal(a, b)
    atol, rtol = tolerance(a.dtype, strict)
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    a, b = torch.where(both_inf, 0, a), torch.where(both_inf, 0, b)
    return bool(torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True))


def nonfinite_set_aside(student, model):
    """(student, model) with 0 wherever both are NaN or infinite, for naming a mistake: a mistake that makes
    a row empty (all its scores -inf) gives NaN or inf there, which of them depends on how the code divides
    (0/0, inf/inf, log 0), and the rest of the row still says which mistake it is."""
    if isinstance(model, tuple) and isinstance(student, (tuple, list)) and len(student) == len(model):
        pairs = [nonfinite_set_aside(s, m) for s, m in zip(student, model)]
        return tuple(s for s, _ in pairs), tuple(m for _, m in pairs)
    if not (isinstance(student, torch.Tensor) and isinstance(model, torch.Tensor)) \
            or student.shape != model.shape or not model.is_floating_point() or not student.is_floating_point():
        return student, model
    both = ~torch.isfinite(student) & ~torch.isfinite(model)
    if not both.any():
        return student, model
    return torch.where(both, 0, student), torch.where(both, 0, model)


def describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return msg("a {dtype} tensor of shape {shape}", dtype=str(value.dtype).replace("torch.", ""),
                   shape=tuple(value.shape))
    if isinstance(value, tuple):
        return msg("a tuple of {count}", count=len(value))
    return getattr(value, "description", type(value).__name__)  # wire.Foreign says what it was


def structure_problem(student, expected, has_float_input=True) -> str | None:
    if isinstance(expected, ModuleState):
        if not isinstance(student, ModuleState):
            return msg("returned {got}; expected the model ({type_name})", got=describe(student),
                       type_name=expected.type_name)
        missing = sorted(set(expected.state) - set(student.state))
        if missing:
            return msg("returned a model without {names}", names=", ".join(missing[:3]))
        return None
    if isinstance(expected, tuple):
        if not isinstance(student, tuple) and not isinstance(student, list):
            return msg("returned {got}; expected a tuple of {count} (output, weights)", got=describe(student),
                       count=len(expected)) if len(expected) == 2 else \
                msg("expected a tuple of {count}", count=len(expected))
        if len(student) != len(expected):
            return msg("returned {count} values; expected {expected}", count=len(student), expected=len(expected))
        for i, (s, e) in enumerate(zip(student, expected)):
            problem = structure_problem(s, e, has_float_input)
            if problem:
                return msg("item {index}: {problem}", index=i, problem=problem)
        return None
    if isinstance(expected, torch.Tensor):
        if not isinstance(student, torch.Tensor):
            return msg("returned {got}; expected {expected}", got=describe(student), expected=describe(expected))
        if student.shape != expected.shape:
            return msg("returned shape {got}; expected {expected}", got=tuple(student.shape),
                       expected=tuple(expected.shape))
        if student.dtype != expected.dtype:
            keep = (msg("") if not expected.is_floating_point() else msg(" (keep the input's dtype)")
                    if has_float_input else msg(" (torch's default dtype)"))
            return msg("returned dtype {got}; expected {expected}{keep}", got=str(student.dtype).replace("torch.", ""),
                       expected=str(expected.dtype).replace("torch.", ""), keep=keep)
    return None


def values_match(student, expected, strict=False) -> bool:
    if isinstance(expected, ModuleState):
        return isinstance(student, ModuleState) and set(student.state) >= set(expected.state) and all(
            close(student.state[k], v, strict) for k, v in expected.state.items())
    if isinstance(expected, tuple):
        return isinstance(student, (tuple, list)) and len(student) == len(expected) and all(
            values_match(s, e, strict) for s, e in zip(student, expected))
    return close(student, expected, strict)


def which_output_differs(student, expected, strict=False, returns=()) -> str:
    if isinstance(expected, ModuleState):
        key = next(k for k, v in expected.state.items() if not close(student.state[k], v, strict))
        return msg("the model's `{key}` differs", key=key)
    if isinstance(expected, tuple) and len(returns) == len(expected):
        parts = [name for name, s, e in zip(returns, student, expected) if not values_match(s, e, strict)]
        if len(parts) == 1:
            return msg("`{name}` differs", name=parts[0])
        return msg("`{names}` and `{last}` differ", names="`, `".join(parts[:-1]), last=parts[-1])
    if isinstance(expected, tuple) and len(expected) == 2:
        parts = [name for name, s, e in zip(("output", "weights"), student, expected)
                 if not values_match(s, e, strict)]
        if len(parts) == 2:
            return msg("output and weights differ")
        return msg("output differs") if parts == ["output"] else msg("weights differ")
    return msg("values differ")




def matches(probe, student, expected) -> bool:
    """The probe's own rule (``equivalent``) if it has one, else ``values_match``."""
    if probe.equivalent is not None:
        return bool(probe.equivalent(student, expected))
    return values_match(student, expected, probe.strict)
