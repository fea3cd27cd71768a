"""The kernel-only rule (Chapter 10): a wrapper allocates and launches, its kernels compute.

Read, never run (``autograder.static_check.static_kernel_only``): correct wrappers in several styles
pass, wrappers and kernels that compute with torch or numpy are refused with a reason naming what and
where. The reference answers come from the chapter's source; the styles and cheats are softmax's.
"""
import textwrap

import nbformat
import pytest

from autograder.hidden import HiddenTests
from autograder.static_check import static_builtin_use, static_kernel_only
from coursekit import conventions as C
from coursekit.sample_submissions import submission

CHAPTER = "10_attention_kernels"
EXERCISES = {"softmax", "online_softmax_states", "flash_attention_forward", "flash_attention_backward",
             "flash_attention", "flash_decoding_partials", "combine_partials", "paged_decoding"}
SUBSTITUTED = {"flash_attention": {"flash_attention_forward", "flash_attention_backward"}}

KERNEL = '''
@triton.jit
def softmax_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * y_row_stride + cols, (e / tl.sum(e, axis=0)).to(y_ptr.dtype.element_ty), mask=inside)
'''
LAUNCH = "    softmax_kernel[(R,)](x, y, x.stride(0), y.stride(0), C, BLOCK=max(16, triton.next_power_of_2(C)))\n"

CORRECT = {
    "empty and shape": '''
def softmax(x):
    R, C = x.shape
    y = torch.empty((R, C), dtype=x.dtype, device=x.device)
''' + LAUNCH + "    return y\n",
    "empty_like, views, size and numbers": '''
def softmax(x, scale=None):
    if scale is None:
        scale = 1 / math.sqrt(x.size(-1))
    R, C = x.size(0), x.size(1)
    y = torch.empty_like(x).contiguous().view(R, C).reshape(R, C)
''' + LAUNCH + "    return y\n",
    "a helper that computes the grid": '''
def grid_of(x):
    return (triton.cdiv(x.shape[0], 1),)

def softmax(x):
    R, C = x.shape
    y = torch.zeros(R, C, dtype=x.dtype, device=x.device)
    softmax_kernel[grid_of(x)](x, y, x.stride(0), y.stride(0), C, BLOCK=triton.next_power_of_2(C))
    return y
''',
}

CHEATS = {
    "torch.softmax": ('''
def softmax(x):
    return torch.softmax(x.float(), -1).to(x.dtype)
''', "torch.softmax"),
    "a tensor method": ('''
def softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)
''', "x.amax"),
    "the @ operator": ('''
def softmax(x):
    R, C = x.shape
    y = torch.empty_like(x)
''' + LAUNCH + "    return y @ torch.eye(C)\n", "@"),
    "a dunder call": ('''
def softmax(x):
    R, C = x.shape
    y = torch.empty_like(x)
''' + LAUNCH + "    return y.__matmul__(torch.eye(C))\n", "__matmul__"),
    "numpy imported": ('''
import numpy as np

def softmax(x):
    e = np.exp(x.numpy())
    return torch.from_numpy(e / e.sum(1, keepdims=True))
''', "numpy"),
    "getattr with the name as a constant": ('''
def softmax(x):
    return getattr(torch, "softmax")(x, -1)
''', "softmax"),
    "a helper that computes": ('''
def normalised(y):
    return torch.nn.functional.softmax(y, dim=-1)

def softmax(x):
    R, C = x.shape
    y = torch.empty_like(x)
''' + LAUNCH + "    return normalised(x)\n", "through `normalised`"),
}

KERNEL_CALLING_TORCH = '''
@triton.jit
def softmax_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    torch.softmax(x_ptr, -1)

def softmax(x):
    R, C = x.shape
    y = torch.empty_like(x)
''' + LAUNCH + "    return y\n"


@pytest.fixture(scope="module")
def release():
    return nbformat.read(C.learner_notebook(CHAPTER), as_version=4)


def refused(release, answers, after=()):
    nb = submission(answers, chapter=CHAPTER)
    nb.cells += [nbformat.v4.new_code_cell(textwrap.dedent(s)) for s in after]
    return static_kernel_only(nb, EXERCISES, release, SUBSTITUTED)


def test_the_reference_answers_pass(release):
    assert refused(release, {}) == {}


@pytest.mark.parametrize("style", sorted(CORRECT))
def test_correct_wrappers_pass(release, style):
    assert refused(release, {"softmax": KERNEL + CORRECT[style]}) == {}


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_computing_outside_kernels_earns_nothing(release, cheat):
    cell, named = CHEATS[cheat]
    found = refused(release, {"softmax": KERNEL + cell})
    assert set(found) == {"softmax"}, found
    assert "earns no marks: cell" in found["softmax"] and named in found["softmax"], found["softmax"]


def test_a_kernel_calling_torch_earns_nothing(release):
    found = refused(release, {"softmax": KERNEL_CALLING_TORCH})
    assert set(found) == {"softmax"} and "inside the @triton.jit kernel `softmax_kernel`" in found["softmax"]


def test_a_learners_own_check_with_torch_costs_nothing(release):
    """A later cell of the learner's comparing with torch is never run by the exercise."""
    check = "assert torch.allclose(softmax(torch.randn(3, 5)), torch.softmax(torch.randn(3, 5), -1)) or True\n"
    assert refused(release, {}, after=[check]) == {}


def test_substituted_dependencies_are_not_followed(release):
    """flash_attention's tests answer its two calls with the reference: a forward that cheats costs the
    forward, not flash_attention."""
    cheat = "def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):\n" \
            "    s = q @ k.transpose(-1, -2)\n    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)\n"
    assert set(refused(release, {"flash_attention_forward": cheat})) == {"flash_attention_forward"}


def test_kernel_only_exercises_are_from_scratch_ones_too(release):
    hidden = HiddenTests(object(), kernel_only={"softmax"})
    assert hidden.from_scratch == {"softmax"} == hidden.kernel_only
    nb = submission({"softmax": KERNEL + CHEATS["torch.softmax"][0]}, chapter=CHAPTER)
    found = static_builtin_use(nb, hidden.from_scratch, release, {}, kernel_only=hidden.kernel_only)
    assert "torch.softmax" in found["softmax"]


def test_importing_numpy_beside_torch_costs_nothing(release):
    """``import torch, numpy`` before the exercises gives their wrappers ``torch``; numpy counts only where
    code computes with it (np.*, or a name imported from numpy)."""
    from coursekit.sample_submissions import insert_after_imports
    nb = submission({}, chapter=CHAPTER)
    insert_after_imports(nb, ["import torch, numpy\nimport numpy as np\n"])
    assert static_kernel_only(nb, EXERCISES, release, SUBSTITUTED) == {}
    nb = submission({"softmax": "from numpy import exp\n" + KERNEL + CORRECT["empty and shape"].replace(
        "    return y\n", "    return exp(y)\n")}, chapter=CHAPTER)
    assert "numpy" in static_kernel_only(nb, EXERCISES, release, SUBSTITUTED)["softmax"]
