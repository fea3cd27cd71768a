"""One probe's verdict: what the kernel returned, judged against the reference, in the grader's process.

``verdicts`` takes its steps in order and stops at the first that finds something:
the call did not run; it used a built-in the exercise forbids; it must raise (and did or did
not); it raised; its returned values (structure, then values, each named by a mistake model
when one matches, with the chapter's hints); what it did to its inputs; its gradients.
Each finding is an ``outcome.Verdict``: its message, and the named mistake, the probe's label and
the message without that case as fields; ``judge_probe`` gives the messages alone.
"""
from __future__ import annotations

import inspect

import torch

from ..messages import from_tests, msg
from ..sandboxed.wire import ModelArg, ModuleState
from . import reference as R
from .compare import close, matches, nonfinite_set_aside, structure_problem, values_match, which_output_differs
from .hints import hints
from .outcome import Verdict

NO_CASE = msg("")  # ``where`` of a message told without its probe's label

# Built-ins that solve a from-scratch exercise; the message says why it earns nothing.
ATTENTION_BUILTINS = {
    "scaled_dot_product_attention": "torch.nn.functional.scaled_dot_product_attention",
    "multi_head_attention_forward": "nn.MultiheadAttention",
    "_scaled_dot_product_attention_math": "torch's internal scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu": "torch's internal flash attention",
    "conv2d": "torch.nn.functional.conv2d",   # Chapter 9's patchify: a strided convolution would do its work
}
BUILTIN_MODULES = {"MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder",
                   "TransformerEncoderLayer", "TransformerDecoderLayer", "Conv2d"}


def judge_probe(probe, got: dict, builtin_names: set) -> list[str]:
    """Problems found in one probe's result (the messages of ``verdicts``); an empty list means it passed."""
    return [v.message for v in verdicts(probe, got, builtin_names)]


def verdicts(probe, got: dict, builtin_names: set) -> list[Verdict]:
    """What one probe's result shows wrong, as data; an empty list means it passed."""
    where = msg(" ({label})", label=from_tests(probe.label)) if probe.label else msg("")
    status = got.get("status")
    found = _not_run(probe, got, where) or _builtin_use(probe, got, builtin_names)
    if found:
        return found
    if probe.raises and status in ("ok", "error"):
        return _expected_error(probe, got, where)
    if status != "ok":
        return _raised(probe, got.get("error", "unknown error"), where)
    found = _returned_values(probe, got, where)
    if found is not None:        # wrong values end the verdict (with their hints)
        return found
    return [*_hints(probe, got["value"], got), *_inputs_changed(probe, got), *_model_arguments_after(probe, got),
            *(_grads(probe, got) if probe.cotangents else [])]


def _found(probe, message, mistake=None, what=None) -> Verdict:
    """MESSAGE, found on PROBE's case. What it says of any case (``Verdict.what``): WHAT when given,
    else the chapter's MISTAKE, else MESSAGE told without the probe's label (its ``where``)."""
    if what is None and mistake is None and "where" in getattr(message, "fields", {}):
        what = message.but(where=NO_CASE)
    return Verdict(message, mistake=mistake, label=probe.label, what=what or "")


def _hints(probe, student, got=None) -> list[Verdict]:
    """The chapter's checks (``hints``): each hint is the chapter's own name for what is wrong."""
    return [_found(probe, hint, mistake=hint) for hint in hints(probe, student, got)]


def _not_implemented(probe) -> Verdict:
    return _found(probe, msg("`{target}` is not implemented yet (it raises NotImplementedError)", target=probe.target),
                  what=f"`{probe.target}` is not implemented yet")


def _not_run(probe, got, where) -> list[Verdict]:
    status = got.get("status")
    if status == "missing":
        return [_found(probe, msg("`{target}` is not defined: did its cell run without errors?", target=probe.target))]
    if status == "timeout":
        return [_found(probe, msg("`{target}` ran longer than {seconds} s{where}: an endless loop?", target=probe.target,
                                  seconds=f"{probe.call_limit():g}", where=where))]
    return []


def _builtin_use(probe, got, builtin_names) -> list[Verdict]:
    """What the kernel says it called (its torch functions, the exercise's submodules): a second way
    to lose the marks, never a way to earn them. A kernel can leave a name out or forge the whole
    record; what must catch a built-in is the static check (``static_check``), which reads the code."""
    used = sorted(ATTENTION_BUILTINS[n] for n in set(got.get("torch_functions", [])) & set(ATTENTION_BUILTINS))
    # The exercise's own class may share a built-in's name (Chapter 5's `Transformer`): not a use of it.
    used += sorted(f"nn.{m}" for m in (set(got.get("submodules", [])) - {probe.target}) & BUILTIN_MODULES)
    if probe.target in builtin_names and used:
        return [_found(probe, msg("`{target}` calls {names}: this exercise asks you to build it from scratch, so it "
                                  "earns no marks", target=probe.target, names=", ".join(used)))]
    return []


def _expected_error(probe, got, where) -> list[Verdict]:
    """A probe that must raise: any exception type, its message naming one of ``probe.raises``."""
    wanted = " / ".join(f"`{w}`" for w in probe.raises)
    if got.get("status") == "ok":
        return [_found(probe, msg("`{target}` returned without raising an error{where}: it must raise one whose "
                                  "message names {wanted}", target=probe.target, where=where, wanted=wanted))]
    error = got.get("error", "")
    if error.startswith("NotImplementedError"):
        return [_not_implemented(probe)]
    # The message itself, not the line of code the kernel appends to ``error``.
    message = got.get("error_message", error)
    if any(w in message for w in probe.raises):
        return []
    return [_found(probe, msg("`{target}` raised {error}{where}, but its message does not name {wanted}",
                              target=probe.target, error=error, where=where, wanted=wanted))]


def _raised(probe, error, where) -> list[Verdict]:
    target = probe.target
    if error.startswith("NotImplementedError"):
        return [_not_implemented(probe)]
    named = _mistake_raising_the_same(probe, error)
    if named:
        return [_found(probe, msg("{mistake}{where} ({error})", mistake=named, where=where, error=error),
                       mistake=named)]
    if "in-place operation" in error:
        return [_found(probe, msg("`{target}` modifies an input in place{where}; return new tensors instead ({error})",
                                  target=target, where=where, error=error),
                       what=f"`{target}` modifies an input in place; return new tensors instead")]
    told = msg("`{target}` raised {error}{where}", target=target, error=error, where=where)
    return [_found(probe, told, what=told.but(error=_error_kind(error), where=NO_CASE))]


def _returned_values(probe, got, where) -> list | None:
    """None when the returned values are right; else the verdict (a mistake's name, or what differs + hints)."""
    expected, student = R.expected_value(probe), got["value"]
    has_float_input = any(isinstance(a, torch.Tensor) and a.is_floating_point()
                          for a in (*probe.args, *probe.kwargs.values()))
    problem = structure_problem(student, expected, has_float_input)
    if problem:
        # A mistake can change the shape too (a width taken from the data, not the argument).
        named = _matching_mistake(probe, student, expected)
        return [_found(probe, msg("{mistake}{where}", mistake=named, where=where), mistake=named) if named else
                _found(probe, msg("`{target}` {problem}{where}", target=probe.target, problem=problem, where=where))]
    if matches(probe, student, expected):
        return None
    named = _matching_mistake(probe, student, expected)
    if named:
        return [_found(probe, msg("{mistake}{where}", mistake=named, where=where), mistake=named)]
    return [_found(probe, msg("`{target}`: {what} from the reference{where}", target=probe.target,
                              what=which_output_differs(student, expected, probe.strict, probe.returns), where=where)),
            *_hints(probe, student)]


def _names(probe, index):
    target = probe.reference
    if isinstance(target, torch.nn.Module):
        target = getattr(target, probe.method)
    params = list(inspect.signature(target).parameters)
    return params[index] if index < len(params) else msg("argument {index}", index=index)


def _inputs_changed(probe, got) -> list[Verdict]:
    """Only for an exercise whose spec forbids it (``HiddenTests(inputs_kept=...)``)."""
    changed = [i for i, (sent, after) in enumerate(zip(probe.args, got.get("inputs_after", [])))
               if probe.keep_inputs and isinstance(sent, torch.Tensor)
               and not (isinstance(after, torch.Tensor) and after.shape == sent.shape
                        and torch.equal(after, sent.detach()))]
    if not changed:
        return []
    names = ", ".join(f"`{_names(probe, i)}`" for i in changed)
    return [_found(probe, msg("`{target}` modified its input {names} in place; return new tensors instead",
                              target=probe.target, names=names))]


def _error_kind(text: str) -> str:
    """An error without the location the kernel appends: "Type: message"."""
    return text.split(" (line ", 1)[0].strip()


def _mistake_raising_the_same(probe, error) -> str | None:
    """The message of the first mistake model that fails with the same error as the submission."""
    for index, mistake in enumerate(probe.mistakes):
        try:
            R.mistake_result(probe, index)
        except Exception as err:  # noqa: BLE001 - the mistake fails the way the submission did?
            first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
            if (f"{type(err).__name__}: {first}" if first else type(err).__name__) == _error_kind(error):
                return from_tests(mistake.message)
    return None


def _model_arguments_after(probe, got) -> list[Verdict]:
    """A model argument must end as the reference leaves it: changed in place, or untouched."""
    problems = []
    after = got.get("inputs_after", [])
    reference_args = R.reference_call(probe)[1]
    for i, sent in enumerate(probe.args):
        if not isinstance(sent, ModelArg):
            continue
        want = ModuleState.of(reference_args[i])
        have = after[i] if i < len(after) else None
        if isinstance(have, ModuleState) and values_match(have, want, probe.strict):
            continue
        name = _names(probe, i)
        changes = not values_match(want, ModuleState.of(sent.module))
        problems.append(_found(probe, msg("`{target}` did not update `{name}` in place: copy the weights into the "
                                          "model it was given", target=probe.target, name=name) if changes else
                               msg("`{target}` changed the parameters of `{name}`; leave the model as it is",
                                   target=probe.target, name=name)))
    return problems


def _matching_mistake(probe, student, expected) -> str | None:
    """The message of the first mistake model whose result the submission reproduces."""
    for index, mistake in enumerate(probe.mistakes):
        try:
            wrong = R.mistake_result(probe, index)
        except Exception:  # noqa: BLE001 - a mistake model that does not apply
            continue
        wrong = R.as_tuple(wrong) if isinstance(expected, tuple) else wrong
        if matches(probe, *nonfinite_set_aside(student, wrong)):
            return from_tests(mistake.message)
    return None


def _grads(probe, got) -> list[Verdict]:
    if "grad_error" in got:
        told = msg("backpropagating through `{target}` failed: {error}", target=probe.target, error=got["grad_error"])
        return [_found(probe, told, what=told.but(error=_error_kind(got["grad_error"])))]
    grads = got.get("grads", {})
    for key, want in R.expected_grads(probe).items():
        have = grads.get(key)
        name = key.split(":", 1)[1] if key.startswith("param:") else _names(probe, int(key[3:]))
        if want is None:
            continue
        if have is None:
            return [_found(probe, msg("no gradient reaches `{name}`: is part of the computation detached "
                                      "(.detach(), .data, .item(), numpy)?", name=name))]
        if not close(have, want, probe.strict):
            return [_found(probe, msg("the gradient with respect to `{name}` differs from the reference", name=name))]
    return []
