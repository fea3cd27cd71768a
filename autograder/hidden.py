"""Parent-side hidden-test API: build probes, then judge what the kernel returned.

A chapter's hidden module (generated from its ``# %% [hidden]`` cells) creates one
``HiddenTests`` and registers a builder per test cell::

    hidden = HiddenTests(ref, from_scratch={"scaled_dot_product_attention"})

    @hidden.test("test_scaled_dot_product_attention_values")
    def _(t):
        q, k, v = t.randn(2, 5, 8), t.randn(2, 7, 8), t.randn(2, 7, 6)
        t.function("scaled_dot_product_attention", q, k, v, grad=True, mistakes=MISTAKES)

Builders only describe calls. The grader writes the inputs for the kernel, the kernel
calls the submission, and ``judge`` compares the returned values with the reference,
computed here, in a process that never ran submitted code.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import inspect
import textwrap
from typing import Any, Callable

import torch

from .messages import from_tests, msg
from .sandboxed.wire import ModelArg, ModuleState

# Built-ins that solve a from-scratch exercise; the message says why it earns nothing.
ATTENTION_BUILTINS = {
    "scaled_dot_product_attention": "torch.nn.functional.scaled_dot_product_attention",
    "multi_head_attention_forward": "nn.MultiheadAttention",
    "_scaled_dot_product_attention_math": "torch's internal scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu": "torch's internal flash attention",
}
BUILTIN_MODULES = {"MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder",
                   "TransformerEncoderLayer", "TransformerDecoderLayer"}


@dataclasses.dataclass
class Mistake:
    """A common wrong implementation: if the submission matches it, say so."""
    message: str
    compute: Callable[..., Any]  # same call as the reference (module mistakes get the module first)


@dataclasses.dataclass
class Probe:
    target: str
    args: tuple
    kwargs: dict
    init: dict | None = None
    state: dict | None = None
    grad_args: tuple = ()
    grad_params: bool = False
    deps: tuple = ()
    mistakes: tuple = ()
    checks: tuple = ()  # callables (probe, outputs) -> message or None, run on passing values
    label: str = ""
    method: str = "forward"  # for modules: the method under test
    dtype: str | None = None  # for modules: parameters cast to this dtype (e.g. "float64")
    time_limit: float = 10.0
    strict: bool = False  # float64 outputs must agree to float64 precision (see ``tolerance``)
    # (student, expected) -> bool, for results whose spec leaves some parts open; default ``values_match``
    equivalent: Callable[[Any, Any], bool] | None = None
    reference: Callable | None = None  # filled by the builder
    cotangents: tuple = ()
    # Names of the returned values, for messages ("`logits` differs"); default (output, weights) for pairs.
    returns: tuple = ()
    # Judge in-place changes to tensor inputs: only for an exercise whose spec text forbids them
    # (``HiddenTests(inputs_kept=...)``); otherwise changing an input in place is a correct style.
    keep_inputs: bool = False
    # The call must raise an error whose message contains one of these strings (e.g. a missing key).
    raises: tuple = ()
    # callables (probe, model_calls) -> message or None: how the code used its model arguments,
    # from the kernel's record (``attn_probe``: one {"method", "rows"} per call of encode, decode,
    # forward or out); run on passing values, as ``checks`` are
    call_checks: tuple = ()


class Builder:
    """Seeded input factory handed to each hidden-test builder."""

    def __init__(self, tests: "HiddenTests", test_id: str):
        self.tests, self.test_id, self.probes = tests, test_id, []
        seed = int(hashlib.sha256(test_id.encode()).hexdigest()[:8], 16)
        self.gen = torch.Generator().manual_seed(seed)

    def randn(self, *shape, dtype=torch.float32):
        return torch.randn(*shape, generator=self.gen, dtype=torch.float64).to(dtype)

    def randint(self, low, high, shape):
        return torch.randint(low, high, shape, generator=self.gen)

    def rand_bool(self, *shape, p=0.7):
        return torch.rand(*shape, generator=self.gen) < p

    def function(self, name, *args, grad=False, mistakes=(), checks=(), label="", deps=(), strict=False,
                 equivalent=None, call_checks=(), returns=(), raises=(), **kwargs):
        """Probe ``name(*args, **kwargs)``.

        strict: compare float64 results to float64 precision. Only for an exercise whose
        spec text requires float64 precision (see ``tolerance``); none does today.
        equivalent: ``(student, expected) -> bool`` replacing ``values_match``, for results
        whose spec leaves some parts ungraded (e.g. tokens after a row's end).
        returns: names of the returned values, for messages (e.g. ``("logits", "presents")``).
        raises: the call must raise an error whose message contains one of these strings
        (the reference must raise too); nothing else of the probe is judged.
        """
        probe = Probe(target=name, args=args, kwargs=kwargs, mistakes=tuple(mistakes),
                      checks=tuple(checks), label=label, deps=tuple(deps), strict=strict,
                      equivalent=equivalent, reference=getattr(self.tests.reference, name),
                      call_checks=tuple(call_checks), returns=tuple(returns), raises=tuple(raises))
        if grad:
            probe.grad_args = _float_tensor_indices(args)
        self._finish(probe, grad)
        return probe

    def module(self, name, init, *args, grad=False, mistakes=(), checks=(), label="", deps=(),
               method="forward", dtype=None, strict=False, returns=(), equivalent=None, **kwargs):
        """Probe ``name(**init).method(*args, **kwargs)`` with the reference's parameter values.

        deps: exercises this one uses (called or constructed); while it is tested the
        reference versions stand in for the learner's, so earlier mistakes cost nothing here.
        Mistake models are called as ``compute(reference_module, *args, **kwargs)``.
        dtype: run the module in this dtype (``torch.float64``), parameters included.
        """
        module = self._reference_module(name, init, dtype).eval()  # as the kernel runs it: dropout off
        probe = Probe(target=name, args=args, kwargs=kwargs, init=dict(init),
                      state={n: p.detach().clone() for n, p in module.named_parameters()},
                      grad_params=grad, mistakes=tuple(mistakes), checks=tuple(checks),
                      label=label, deps=tuple(deps), reference=module, method=method, strict=strict,
                      dtype=None if dtype is None else str(dtype).replace("torch.", ""),
                      returns=tuple(returns), equivalent=equivalent)
        if grad:
            probe.grad_args = _float_tensor_indices(args)
        self._finish(probe, grad)
        return probe

    def model(self, name, init, dtype=None) -> ModelArg:
        """A model argument: reference class ``name(**init)`` with random non-default parameters, in eval mode.

        The exercise that receives it is graded on its own: in the kernel too, the model is
        built from the reference. Its class (and the classes it uses) must be exercises whose
        tests come earlier in the notebook, or given code.
        """
        module = self._reference_module(name, init, dtype).eval()
        return ModelArg(name, dict(init), {n: p.detach().clone() for n, p in module.named_parameters()},
                        None if dtype is None else str(dtype).replace("torch.", ""), module)

    def _reference_module(self, name, init, dtype):
        cls = getattr(self.tests.reference, name)
        torch.manual_seed(int(self.gen.initial_seed()) % 2**31 + len(self.probes))
        module = cls(**init)
        if dtype is not None:
            module = module.to(dtype)
        with torch.no_grad():  # non-default values so that a wrong parameter shows
            for p in module.parameters():
                p.copy_(self.randn(*p.shape, dtype=p.dtype) * 0.5)
        return module

    def _finish(self, probe, grad):
        probe.keep_inputs = probe.target in self.tests.inputs_kept
        if probe.raises:
            try:
                _call_reference(probe)
            except Exception:  # noqa: BLE001 - as it should
                pass
            else:
                raise ValueError(f"{self.test_id}: the reference does not raise on a probe that expects an error")
        if grad:
            outs = _as_tuple(_call_reference(probe))
            probe.cotangents = tuple(self.randn(*o.shape, dtype=o.dtype) for o in outs
                                     if isinstance(o, torch.Tensor) and o.is_floating_point())
        self.probes.append(probe)


def _float_tensor_indices(args):
    return tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point())


def _as_tuple(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, ModelArg):
        return value.fresh()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _call_reference(probe, with_grad=False, keep_args=False):
    args = [_clone(a) for a in probe.args]
    for i in probe.grad_args:
        args[i].requires_grad_(with_grad)
    kwargs = {k: _clone(v) for k, v in probe.kwargs.items()}
    target = probe.reference
    if isinstance(target, torch.nn.Module):
        target.zero_grad(set_to_none=True)
        target = getattr(target, probe.method)
    out = target(*args, **kwargs)
    return (out, args) if with_grad or keep_args else out


def _as_judged(value):
    """What the judge compares: modules by their state, everything else as it is."""
    if isinstance(value, torch.nn.Module):
        return ModuleState.of(value)
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple):
        return tuple(_as_judged(v) for v in value)
    return value


class HiddenTests:
    def __init__(self, reference, from_scratch=(), inputs_kept=()):
        """inputs_kept: exercises whose spec text says they must not change their inputs in place;
        only their probes judge that (any other exercise may change them: a correct style)."""
        self.reference = reference
        self.from_scratch = set(from_scratch)
        self.inputs_kept = set(inputs_kept)
        self.builders: dict[str, Callable[[Builder], None]] = {}
        self.memory_rules: dict[str, tuple[int, str]] = {}

    def test(self, test_id, max_memory: tuple[int, str] | None = None):
        """Register a test's builder.

        max_memory: (bytes, message). The grader reads, from outside the sandbox, how far
        the kernel's peak resident memory rose during this test cell above its memory just
        before; above the limit the test fails with the message (and the figure).
        """
        def register(fn):
            self.builders[test_id] = fn
            if max_memory is not None:
                self.memory_rules[test_id] = (int(max_memory[0]), str(max_memory[1]))
            return fn
        return register

    def model_source(self, name) -> str:
        """Source that defines the reference class ``name`` and every reference class or function it uses."""
        ref, order, todo = self.reference, [], [name]
        while todo:
            current = todo.pop()
            if current in order:
                continue
            order.append(current)
            tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(ref, current))))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Name) and node.id not in order and inspect.getmodule(
                        getattr(ref, node.id, None)) is ref and (inspect.isclass(getattr(ref, node.id))
                                                                  or inspect.isfunction(getattr(ref, node.id)))):
                    todo.append(node.id)
        defined = [n for n, _ in inspect.getmembers(ref) if n in order]
        by_line = sorted(defined, key=lambda n: inspect.getsourcelines(getattr(ref, n))[1])
        return "\n\n".join([ref.EXPORTS_SOURCE, *(inspect.getsource(getattr(ref, n)) for n in by_line)])

    def build(self, test_id) -> list[Probe]:
        builder = Builder(self, test_id)
        self.builders[test_id](builder)
        return builder.probes

    def dependency_source(self, names) -> str:
        """Source that defines dependency exercises as the reference does, for substitution."""
        parts = [self.reference.EXPORTS_SOURCE]
        parts += [inspect.getsource(getattr(self.reference, name)) for name in names]
        return "\n\n".join(parts)


# ----------------------------------------------------------------------------- judging

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


def describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return msg("a {dtype} tensor of shape {shape}", dtype=str(value.dtype).replace("torch.", ""),
                   shape=tuple(value.shape))
    if isinstance(value, tuple):
        return msg("a tuple of {count}", count=len(value))
    return getattr(value, "description", type(value).__name__)  # wire.Foreign says what it was


def _names(probe, index):
    target = probe.reference
    if isinstance(target, torch.nn.Module):
        target = getattr(target, probe.method)
    params = list(inspect.signature(target).parameters)
    return params[index] if index < len(params) else msg("argument {index}", index=index)


def _structure_problem(student, expected, has_float_input=True) -> str | None:
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
            problem = _structure_problem(s, e, has_float_input)
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


def _matches(probe, student, expected) -> bool:
    if probe.equivalent is not None:
        return bool(probe.equivalent(student, expected))
    return values_match(student, expected, probe.strict)


def values_match(student, expected, strict=False) -> bool:
    if isinstance(expected, ModuleState):
        return isinstance(student, ModuleState) and set(student.state) >= set(expected.state) and all(
            close(student.state[k], v, strict) for k, v in expected.state.items())
    if isinstance(expected, tuple):
        return isinstance(student, (tuple, list)) and len(student) == len(expected) and all(
            values_match(s, e, strict) for s, e in zip(student, expected))
    return close(student, expected, strict)


def _which_output_differs(student, expected, strict=False, returns=()) -> str:
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


def judge_probe(probe: Probe, got: dict, builtin_names: set) -> list[str]:
    """Problems found in one probe's result; an empty list means it passed."""
    where = msg(" ({label})", label=from_tests(probe.label)) if probe.label else msg("")
    target = probe.target
    status = got.get("status")
    if status == "missing":
        return [msg("`{target}` is not defined: did its cell run without errors?", target=target)]
    if status == "timeout":
        return [msg("`{target}` ran longer than {seconds} s{where}: an endless loop?", target=target,
                    seconds=f"{probe.time_limit:g}", where=where)]
    if status == "not-run":
        return [got["reason"]]
    used = sorted(ATTENTION_BUILTINS[n] for n in set(got.get("torch_functions", [])) & set(ATTENTION_BUILTINS))
    # The exercise's own class may share a built-in's name (Chapter 5's `Transformer`): not a use of it.
    used += sorted(f"nn.{m}" for m in (set(got.get("submodules", [])) - {probe.target}) & BUILTIN_MODULES)
    if probe.target in builtin_names and used:
        return [msg("`{target}` calls {names}: this exercise asks you to build it from scratch, so it earns "
                    "no marks", target=target, names=", ".join(used))]
    if probe.raises and status in ("ok", "error"):
        return _judge_expected_error(probe, got, where)
    if status != "ok":
        error = got.get("error", "unknown error")
        if error.startswith("NotImplementedError"):
            return [msg("`{target}` is not implemented yet (it raises NotImplementedError)", target=target)]
        named = _mistake_raising_the_same(probe, error)
        if named:
            return [msg("{mistake}{where} ({error})", mistake=named, where=where, error=error)]
        if "in-place operation" in error:
            return [msg("`{target}` modifies an input in place{where}; return new tensors instead ({error})",
                        target=target, where=where, error=error)]
        return [msg("`{target}` raised {error}{where}", target=target, error=error, where=where)]
    expected, reference_args = _call_reference(probe, with_grad=False, keep_args=True)
    expected = _as_judged(expected)
    student = got["value"]
    has_float_input = any(isinstance(a, torch.Tensor) and a.is_floating_point()
                          for a in (*probe.args, *probe.kwargs.values()))
    problem = _structure_problem(student, expected, has_float_input)
    if problem:
        # A mistake can change the shape too (a width taken from the data, not the argument).
        named = _matching_mistake(probe, student, expected)
        return [msg("{mistake}{where}", mistake=named, where=where) if named else
                msg("`{target}` {problem}{where}", target=target, problem=problem, where=where)]
    problems = []
    if not _matches(probe, student, expected):
        named = _matching_mistake(probe, student, expected)
        if named:
            return [msg("{mistake}{where}", mistake=named, where=where)]
        problems.append(msg("`{target}`: {what} from the reference{where}", target=target,
                            what=_which_output_differs(student, expected, probe.strict, probe.returns),
                            where=where))
        for check in probe.checks:
            hint = check(probe, student)
            if hint:
                problems.append(from_tests(hint))
        return problems
    for check in probe.checks:
        hint = check(probe, student)
        if hint:
            problems.append(from_tests(hint))
    for check in probe.call_checks:
        hint = check(probe, got.get("model_calls"))
        if hint:
            problems.append(from_tests(hint))
    changed = [i for i, (sent, after) in enumerate(zip(probe.args, got.get("inputs_after", [])))
               if probe.keep_inputs and isinstance(sent, torch.Tensor)
               and not (isinstance(after, torch.Tensor) and after.shape == sent.shape
                        and torch.equal(after, sent.detach()))]
    if changed:
        names = ", ".join(f"`{_names(probe, i)}`" for i in changed)
        problems.append(msg("`{target}` modified its input {names} in place; return new tensors instead",
                            target=target, names=names))
    problems += _model_arguments_after(probe, got, reference_args)
    if probe.cotangents:
        problems += _judge_grads(probe, got)
    return problems


def _judge_expected_error(probe, got, where) -> list[str]:
    """A probe that must raise: any exception type, its message naming one of ``probe.raises``."""
    wanted = " / ".join(f"`{w}`" for w in probe.raises)
    if got.get("status") == "ok":
        return [msg("`{target}` returned without raising an error{where}: it must raise one whose message "
                    "names {wanted}", target=probe.target, where=where, wanted=wanted)]
    error = got.get("error", "")
    if error.startswith("NotImplementedError"):
        return [msg("`{target}` is not implemented yet (it raises NotImplementedError)", target=probe.target)]
    # The message itself, not the line of code the kernel appends to ``error``.
    message = got.get("error_message", error)
    if any(w in message for w in probe.raises):
        return []
    return [msg("`{target}` raised {error}{where}, but its message does not name {wanted}",
                target=probe.target, error=error, where=where, wanted=wanted)]


def _error_kind(text: str) -> str:
    """An error without the location the kernel appends: "Type: message"."""
    return text.split(" (line ", 1)[0].strip()


def _mistake_raising_the_same(probe, error) -> str | None:
    """The message of the first mistake model that fails with the same error as the submission."""
    for mistake in probe.mistakes:
        try:
            mistake.compute(*([probe.reference] if isinstance(probe.reference, torch.nn.Module) else []),
                            *[_clone(a) for a in probe.args], **{k: _clone(v) for k, v in probe.kwargs.items()})
        except Exception as err:  # noqa: BLE001 - the mistake fails the way the submission did?
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
            if (f"{type(err).__name__}: {first}" if first else type(err).__name__) == _error_kind(error):
                return from_tests(mistake.message)
    return None


def _model_arguments_after(probe, got, reference_args) -> list[str]:
    """A model argument must end as the reference leaves it: changed in place, or untouched."""
    problems = []
    after = got.get("inputs_after", [])
    for i, sent in enumerate(probe.args):
        if not isinstance(sent, ModelArg):
            continue
        want = ModuleState.of(reference_args[i])
        have = after[i] if i < len(after) else None
        if isinstance(have, ModuleState) and values_match(have, want, probe.strict):
            continue
        name = _names(probe, i)
        changes = not values_match(want, ModuleState.of(sent.module))
        problems.append(msg("`{target}` did not update `{name}` in place: copy the weights into the model it "
                            "was given", target=probe.target, name=name) if changes else
                        msg("`{target}` changed the parameters of `{name}`; leave the model as it is",
                            target=probe.target, name=name))
    return problems


def _matching_mistake(probe, student, expected) -> str | None:
    """The message of the first mistake model whose result the submission reproduces."""
    for mistake in probe.mistakes:
        try:
            wrong = mistake.compute(*([probe.reference] if isinstance(probe.reference, torch.nn.Module) else []),
                                    *[_clone(a) for a in probe.args],
                                    **{k: _clone(v) for k, v in probe.kwargs.items()})
        except Exception:  # noqa: BLE001 - a mistake model that does not apply
            continue
        wrong = _as_judged(wrong)
        if _matches(probe, student, _as_tuple(wrong) if isinstance(expected, tuple) else wrong):
            return from_tests(mistake.message)
    return None


def _judge_grads(probe, got) -> list[str]:
    if "grad_error" in got:
        return [msg("backpropagating through `{target}` failed: {error}", target=probe.target,
                    error=got["grad_error"])]
    out, args = _call_reference(probe, with_grad=True)
    outs = [o for o in _as_tuple(out) if isinstance(o, torch.Tensor) and o.is_floating_point()]
    loss = sum((o * c).sum() for o, c in zip(outs, probe.cotangents) if o.requires_grad)
    loss.backward()
    expected = {f"arg{i}": args[i].grad for i in probe.grad_args}
    if isinstance(probe.reference, torch.nn.Module):
        expected.update({f"param:{n}": p.grad for n, p in probe.reference.named_parameters()
                         if n in (probe.state or {})})
    grads = got.get("grads", {})
    for key, want in expected.items():
        have = grads.get(key)
        name = key.split(":", 1)[1] if key.startswith("param:") else _names(probe, int(key[3:]))
        if want is None:
            continue
        if have is None:
            return [msg("no gradient reaches `{name}`: is part of the computation detached "
                        "(.detach(), .data, .item(), numpy)?", name=name)]
        if not close(have, want, probe.strict):
            return [msg("the gradient with respect to `{name}` differs from the reference", name=name)]
    return []


def rows_sum_to_one(probe, value):
    """Hint for (output, weights) results whose weights are not distributions."""
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], torch.Tensor):
        weights = value[1]
        if weights.is_floating_point() and weights.numel():
            sums = weights.sum(-1)
            if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
                return msg("weights rows do not sum to 1: take the softmax over the last dimension (the keys)")
    return None


__all__ = ["HiddenTests", "Mistake", "ModelArg", "ModuleState", "Probe", "judge_probe", "rows_sum_to_one", "close", "tolerance"]
