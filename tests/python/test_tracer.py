"""The tracer's proxy semantics and errors, without the C++ tool (except where marked): object
identity of in-place results and views, indexing and setitem, argument and result structures,
input layouts, constants, and the errors for unsupported ops and value-dependent control flow.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln._tracer import device_str, float_str
from kiln_opt_tool import ON_CPU, checked, needs_kiln_opt, without_subsymbols

DEVICE = torch.empty(0).device  # where the tests' tensors are (conftest.py: KILN_TEST_DEVICE)
DEV = device_str(DEVICE)  # as traces spell it
DEVICE_ARG = "" if DEVICE.type == "cpu" else f', device="{DEV}"'  # of creation ops, off the CPU


def statements(text: str) -> list[str]:
    """The statements of a trace without their comments."""
    out = []
    for line in text.splitlines():
        s = line.split("  #")[0].strip()
        if s and not s.startswith("#") and not s.startswith("def "):
            out.append(s)
    return out


# ---- identity ----------------------------------------------------------------------------------


def test_inplace_returns_the_same_proxy_and_renames_it():
    seen = {}

    def f(x):
        y = x.add_(1)
        seen["same"] = y is x
        x += 2  # __iadd__ returns the same object too
        seen["iadd_same"] = x is y
        z = F.relu(x, inplace=True)
        seen["relu_same"] = z is y
        return x

    text = kiln.trace(f, torch.ones(3))
    assert seen == {"same": True, "iadd_same": True, "relu_same": True}
    assert statements(text) == [
        "t0 = ltorch.add_(x, 1)",
        "t1 = ltorch.add_(t0, 2)",
        "t2 = ltorch.relu_(t1)",
        'return {"output": (t2,)}',
    ]


def test_view_is_a_new_proxy_and_keeps_its_name_after_a_write_to_the_base():
    seen = {}

    def f(x):
        y = x.view(8)
        seen["new"] = y is not x and isinstance(y, torch.Tensor) and isinstance(y, kiln.Proxy)
        x.add_(1)
        return y  # V2: y names the view; kiln's functionalize makes it read the new x

    text = kiln.trace(f, torch.ones(4, 2))
    assert seen == {"new": True}
    assert statements(text) == ["t0 = ltorch.view(x, [8])", "t1 = ltorch.add_(x, 1)", 'return {"output": (t0,)}']


def test_noop_forms_return_the_tensor_itself_without_an_op():
    seen = {}

    def f(x):
        seen["to"] = x.to(torch.float32) is x
        seen["float"] = x.float() is x
        seen["contiguous"] = x.contiguous() is x
        seen["flatten"] = x.flatten(0, 0) is x
        seen["own device"] = (x.cuda() if DEVICE.type == "cuda" else x.cpu()) is x
        return x

    text = kiln.trace(f, torch.ones(2, 3))
    assert seen == {"to": True, "float": True, "contiguous": True, "flatten": True, "own device": True}
    assert statements(text) == ['return {"output": (x,)}']


def test_metadata_mutation_changes_the_proxy_and_keeps_identity():
    seen = {}

    def f(x):
        y = x.transpose_(1, 0)
        seen["same"] = y is x
        seen["shape"] = tuple(x.shape)
        seen["stride"] = x.stride()
        x.unsqueeze_(0)
        return x

    text = kiln.trace(f, torch.ones(4, 2))
    assert seen == {"same": True, "shape": (2, 4), "stride": (1, 2)}
    assert statements(text) == [
        "t0 = ltorch.transpose_(x, 1, 0)",
        "t1 = ltorch.unsqueeze_(t0, 0)",
        'return {"output": (t1,)}',
    ]


def test_metadata_queries_answer_as_eager():
    seen = {}

    def f(x):
        seen["shape"] = x.shape
        seen["size1"] = x.size(1)
        seen["dtype"] = x.dtype
        seen["device"] = x.device
        seen["is_cuda"] = x.is_cuda
        seen["len"] = len(x)
        seen["ndim"] = x.ndim
        seen["numel"] = x.numel()
        seen["t_contiguous"] = x.t().is_contiguous()
        seen["sum_dtype"] = x.sum().dtype
        return x.t()

    kiln.trace(f, torch.ones(3, 4, dtype=torch.float64))
    assert seen == {
        "shape": torch.Size([3, 4]), "size1": 4, "dtype": torch.float64,
        "device": DEVICE, "is_cuda": DEVICE.type == "cuda", "len": 3, "ndim": 2, "numel": 12,
        "t_contiguous": False, "sum_dtype": torch.float64,
    }


def test_clone_is_a_copy_not_a_view():
    def f(x):
        y = x.clone()
        y.add_(1)
        return y

    text = kiln.trace(f, torch.ones(3))
    assert statements(text) == [
        "t0 = ltorch.empty_like(x)",
        "t1 = ltorch.copy_(t0, x)",
        "t2 = ltorch.add_(t1, 1)",
        'return {"output": (t2,)}',
    ]


def test_reshape_that_copies_in_eager_is_written_as_a_copy():
    # x.t() is not viewable as [8]: eager copies, so the trace must not make it a view of x.
    def f(x):
        return x.t().reshape(8), x.reshape(2, 4)

    text = kiln.trace(f, torch.ones(4, 2))
    assert statements(text) == [
        "t0 = ltorch.t(x)",
        f"t1 = ltorch.zeros([2, 4], dtype=torch.float32{DEVICE_ARG})",
        "t2 = ltorch.copy_(t1, t0)",
        "t3 = ltorch.view(t2, [8])",
        "t4 = ltorch.reshape(x, [2, 4])",
        'return {"output": (t3, t4)}',
    ]


# ---- indexing ----------------------------------------------------------------------------------


def test_getitem_keys():
    def f(x):
        return x[1:3], x[:, 0], x[None], x[..., 1], x[-1, ::2], x[()]

    text = kiln.trace(f, torch.ones(4, 6))
    assert statements(text)[:6] == [
        "t0 = ltorch.getitem(x, (slice(1, 3, None),))",
        "t1 = ltorch.getitem(x, (slice(None, None, None), 0))",
        "t2 = ltorch.getitem(x, (None,))",
        "t3 = ltorch.getitem(x, (..., 1))",
        "t4 = ltorch.getitem(x, (-1, slice(None, None, 2)))",
        "t5 = ltorch.getitem(x, ())",
    ]
    assert f'# t1: "{DEV} f32[4]"' in text and f'# t2: "{DEV} f32[1, 4, 6]"' in text


def test_setitem_records_a_mutation_without_a_result():
    def f(x, v):
        x[1:3] = v
        x[0] = 2.5
        return x

    text = kiln.trace(f, torch.ones(4, 2), torch.zeros(2))
    assert statements(text) == [
        "ltorch.setitem_(x, (slice(1, 3, None),), v)",
        "ltorch.setitem_(x, (0,), 2.5)",
        'return {"output": (x,)}',
    ]
    assert "  # test_tracer.py:" in text  # a statement without results still has its location


def test_indexing_with_tensors_apart_needs_kiln_jit():
    # Index tensors with a slice between them run as an eager step (tests/python/test_index.py),
    # which a trace alone cannot hold.
    def f(x, i):
        return x[i, :, i]

    with pytest.raises(kiln.UnsupportedError, match=r"torch.Tensor.__getitem__.*only kiln.jit can run") as info:
        kiln.trace(f, torch.ones(4, 4, 4), torch.tensor([0, 1]))
    assert info.value.location.text == "return x[i, :, i]"


def test_indexing_with_two_adjacent_tensors_selects_from_the_merged_dims():
    text = kiln.trace(lambda x, i, j: x[i, j], torch.ones(4, 3, 2), torch.tensor([0, -1]), torch.tensor([2, 1]))
    # Each index checked against its own dim (an index_select of its positions), then one flat
    # position into the [12, 2] view.
    assert "ltorch.view(x, [12, 2])" in text and "ltorch.index_select(t14, 0, t13)" in text, text
    assert text.count("ltorch.wrap_index(") == 2 and "ltorch.mul(" in text, text


def test_indexing_with_one_tensor_is_an_index_select_of_the_wrapped_index():
    text = kiln.trace(lambda x, i: x[i], torch.ones(4, 2), torch.tensor([0, -1]))
    assert "ltorch.wrap_index(t0, 4)" in text and "ltorch.index_select(x, 0, t1)" in text, text


# ---- arguments, results, constants -------------------------------------------------------------


def test_scalars_are_constants_and_structures_hold_tensors():
    def f(xs, d, k, flag):
        a, b = xs
        y = a * k + d["w"]
        if flag:  # a Python bool argument: ordinary control flow
            y = y - b
        return {"y": y, "pair": (a, 3), "none": None}

    program = kiln.trace_program(f, [torch.ones(2), torch.ones(2)], {"w": torch.ones(2)}, 3, True)
    assert program.input_names == ["xs_0", "xs_1", "d_w"]
    assert statements(program.text) == [
        "t0 = ltorch.mul(xs_0, 3)",
        "t1 = ltorch.add(t0, d_w)",
        "t2 = ltorch.sub(t1, xs_1)",
        'return {"output": (t2, xs_0)}',
    ]
    result = torch.utils._pytree.tree_unflatten(program.output_leaves, program.output_spec)
    assert result == {"y": "t2", "pair": ("xs_0", 3), "none": None}


def test_input_names_are_identifiers_and_unique():
    def f(a_0, a, **kw):
        return a_0 + a[0] + kw["ü"]

    program = kiln.trace_program(f, torch.ones(2), [torch.ones(2)], **{"ü": torch.ones(2)})
    assert program.input_names == ["a_0", "a_0_1", "kw__"]


def test_input_types_carry_strides_offset_dtype_and_device():
    base = torch.zeros(10)

    def f(a, b, c, d, e):
        return a

    text = kiln.trace(f, base[1::2], torch.ones(3, 4).t(), torch.tensor(2.0), torch.ones(0, 3, dtype=torch.bfloat16), torch.ones(2, dtype=torch.int32))
    assert f'# a: "{DEV} f32[5] strides=(2,) offset=1"' in text
    assert f'# b: "{DEV} f32[4, 3] strides=(1, 4) offset=0"' in text
    assert f'# c: "{DEV} f32[] strides=() offset=0"' in text
    assert f'# d: "{DEV} bf16[0, 3] strides=(3, 1) offset=0"' in text
    assert f'# e: "{DEV} i32[2] strides=(1,) offset=0"' in text


def test_result_types_follow_eager_promotion():
    def f(x, i, h):
        return x + i, i + 2.5, h * 2, i / 2, (i > 1), h.sum(), i.sum()

    text = kiln.trace(f, torch.ones(3), torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.float16))
    types = re.findall(r'# t\d+: "([^"]+)"', text)
    assert types == [f"{DEV} f32[3]", f"{DEV} f32[3]", f"{DEV} f16[3]", f"{DEV} f32[3]", f"{DEV} bool[3]", f"{DEV} f16[]", f"{DEV} i64[]"]


def test_reflected_operators_are_eager_computations():
    def f(x):
        return 2 - x, 2 / x, 2 ** x, 1 + x, 3 * x

    assert statements(kiln.trace(f, torch.ones(3))) == [
        "t0 = ltorch.neg(x)",
        "t1 = ltorch.add(t0, 2)",
        "t2 = ltorch.reciprocal(x)",
        "t3 = ltorch.mul(t2, 2)",
        "t4 = ltorch.full_like(x, 2)",
        "t5 = ltorch.pow(t4, x)",
        "t6 = ltorch.add(x, 1)",
        "t7 = ltorch.mul(x, 3)",
        'return {"output": (t1, t3, t5, t6, t7)}',
    ]


@pytest.mark.skipif(not ON_CPU, reason="the expected text is that of CPU creation ops")
def test_creation_records_dtype_and_device():
    def f(x):
        return torch.zeros(2, 3) + torch.full((3,), 7) + torch.arange(3) + torch.ones_like(x, dtype=torch.float64) + torch.tensor(1.5)

    s = statements(kiln.trace(f, torch.ones(3)))
    assert s[:3] == [
        "t0 = ltorch.zeros([2, 3], dtype=torch.float32)",
        "t1 = ltorch.full([3], 7, dtype=torch.int64)",
        "t2 = ltorch.add(t0, t1)",
    ]
    assert "t3 = ltorch.arange(0, 3, dtype=torch.int64)" in s
    assert "t5 = ltorch.ones_like(x, dtype=torch.float64)" in s
    assert "t7 = ltorch.full([], 1.5, dtype=torch.float32)" in s


def test_keyword_and_default_arguments_are_written_as_kiln_prints_them():
    def f(x):
        return (
            x.sum(dim=1, keepdim=True),
            torch.add(x, x, alpha=2),
            x.var(0, unbiased=False),
            F.softmax(x, dim=-1),
            x.clamp(max=1),
            x.div(2, rounding_mode="floor"),
            F.gelu(x, approximate="tanh"),
            x.max(1),
        )

    s = statements(kiln.trace(f, torch.ones(2, 3)))
    assert s == [
        "t0 = ltorch.sum(x, [1], True)",
        "t1 = ltorch.add(x, x, alpha=2)",
        "t2 = ltorch.var(x, [0], correction=0)",
        "t3 = ltorch.softmax(x, -1)",
        "t4 = ltorch.clamp(x, None, 1)",
        't5 = ltorch.div(x, 2, rounding_mode="floor")',
        't6 = ltorch.gelu(x, approximate="tanh")',
        "t7 = ltorch.amax(x, [1])",
        "t8 = ltorch.argmax(x, 1)",
        'return {"output": (t0, t1, t2, t3, t4, t5, t6, t7, t8)}',
    ]


def test_split_has_several_results():
    def f(x):
        a, b = x.split([1, 2], dim=1)
        return b

    text = kiln.trace(f, torch.ones(2, 3))
    assert f't0, t1 = ltorch.split(x, [1, 2], 1)  # t0: "{DEV} f32[2, 1]", t1: "{DEV} f32[2, 2]"' in text


# ---- errors ------------------------------------------------------------------------------------


def test_unknown_op_raises_unsupported_error_naming_op_and_line():
    def f(x):
        y = x + 1
        return y.cumsum(0)

    with pytest.raises(kiln.UnsupportedError) as info:
        kiln.trace(f, torch.ones(3))
    e = info.value
    assert e.op == "torch.Tensor.cumsum"
    assert e.location.text == "return y.cumsum(0)"
    assert e.location.filename == __file__
    assert "torch.Tensor.cumsum" in str(e) and "test_tracer.py" in str(e) and "return y.cumsum(0)" in str(e)


def test_unknown_functional_and_torch_functions_are_named_as_written():
    with pytest.raises(kiln.UnsupportedError, match=r"torch\.nn\.functional\.hardtanh"):
        kiln.trace(lambda x: F.hardtanh(x), torch.ones(3))
    with pytest.raises(kiln.UnsupportedError, match=r"torch\.cumprod"):
        kiln.trace(lambda x: torch.cumprod(x, 0), torch.ones(3))
    with pytest.raises(kiln.UnsupportedError, match=r"torch\.randn"):
        kiln.trace(lambda x: x + torch.randn(3), torch.ones(3))


def test_unsupported_argument_forms():
    with pytest.raises(kiln.UnsupportedError, match="out= takes one tensor"):
        kiln.trace(lambda x: torch.max(x, 0, out=(x, x)), torch.ones(3))
    with pytest.raises(kiln.UnsupportedError, match="decimals"):
        kiln.trace(lambda x: x.round(decimals=2), torch.ones(3))
    with pytest.raises(kiln.UnsupportedError, match="dtype"):
        kiln.trace(lambda x: x.to(torch.uint8), torch.ones(3))
    with pytest.raises(kiln.UnsupportedError, match="dtype"):
        kiln.trace(lambda x: x, torch.ones(3, dtype=torch.uint8))


def test_captured_tensor_is_unsupported():
    weight = torch.ones(3)

    def f(x):
        return x * weight

    with pytest.raises(kiln.UnsupportedError, match="not an argument of the traced function"):
        kiln.trace(f, torch.ones(3))


def test_control_flow_on_a_tensor_value_raises_trace_error():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(kiln.TraceError) as info:
        kiln.trace(f, torch.ones(3))
    e = info.value
    assert e.location.text == "if x.sum() > 0:"
    message = str(e)
    assert "if x.sum() > 0:" in message and "test_tracer.py" in message
    assert "bool()" in message and "unknown while tracing" in message


@pytest.mark.parametrize(
    "body, what",
    [
        (lambda x: x.sum().item(), "item()"),
        (lambda x: float(x.sum()), "float()"),
        (lambda x: x.tolist(), "tolist()"),
        (lambda x: int(x[0]), "int()"),
    ],
    ids=["item", "float", "tolist", "int"],
)
def test_conversions_to_python_values_raise_trace_error(body, what):
    with pytest.raises(kiln.TraceError, match=re.escape(what)):
        kiln.trace(body, torch.ones(3))


def test_eager_errors_are_raised_with_the_users_line():
    def f(x):
        return x.t().view(8)

    with pytest.raises(RuntimeError, match="view size is not compatible") as info:
        kiln.trace(f, torch.ones(4, 2))
    assert "return x.t().view(8)" in str(info.value)

    def g(x, y):
        return x + y

    # The meta kernels' wording can differ from the CPU kernel's; the type is eager's.
    with pytest.raises(RuntimeError, match="broadcast") as info:
        kiln.trace(g, torch.ones(4), torch.ones(3))
    assert "return x + y" in str(info.value)


def test_inplace_on_a_leaf_that_requires_grad_raises_like_eager():
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        kiln.trace(lambda x: x.add_(1), torch.ones(3, requires_grad=True))


# ---- text form ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        (1.0, "1.0"), (0.5, "0.5"), (-2.0, "-2.0"), (0.1, "0.1"), (1e-05, "1e-05"),
        (0.0001, "1e-04"), (0.001, "0.001"), (123456.0, "123456.0"), (1e16, "1e+16"),
        (1.5e300, "1.5e+300"), (2.5e-7, "2.5e-07"), (0.0, "0.0"), (-0.0, "-0.0"),
        (float("inf"), "float('inf')"), (float("-inf"), "-float('inf')"),
        (float("nan"), "float('nan')"), (1234567.0, "1234567.0"), (12345678.9, "12345678.9"),
    ],
)
def test_float_constants_are_written_as_kiln_writes_them(value, text):
    assert float_str(value) == text


@needs_kiln_opt
def test_float_constants_print_back_unchanged():
    def f(x):
        return x * 1e-05 + 0.0001 - 1e16 * x + x.clamp(-1.5e300, 2.5e-7) + float("inf") * x + 123456.0

    text = kiln.trace(f, torch.ones(3, dtype=torch.float64))
    assert without_subsymbols(checked(text)) == text
