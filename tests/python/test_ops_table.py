"""python/kiln/_ops.py mirrors src/kiln/ir/ops.def: every row's name, signature, in-place flag,
output count and alias kind must agree, so that the tracer writes calls the way kiln reads them."""

from __future__ import annotations

import os
import re

import pytest

from kiln._ops import OPS, ROWS

OPS_DEF = os.path.join(os.path.dirname(__file__), "..", "..", "src", "kiln", "ir", "ops.def")


def ops_def_rows() -> list[tuple]:
    text = open(OPS_DEF).read()
    rows = []
    for m in re.finditer(r"^KILN_(UNARY|BINARY|TERNARY|OP|COMPOSITE)\((.*)\)\s*$", text, re.M):
        kind, body = m.groups()
        name = re.match(r'\s*\w+, "(\w+)"', body).group(1)
        if kind == "UNARY":
            inplace = body.split(",")[3].strip() == "true"
            rows.append((name, "unary", "self:T", inplace, 1, "kNone"))
        elif kind in ("BINARY", "TERNARY"):
            sig = re.match(r'\s*\w+, "\w+", "([^"]*)"', body).group(1)
            inplace = body.split(f'"{sig}"', 1)[1].split(",")[2].strip() == "true"
            rows.append((name, kind.lower(), sig, inplace, 1, "kNone"))
        elif kind == "COMPOSITE":  # one fresh result (ops.def's KILN_COMPOSITE)
            sig = re.match(r'\s*\w+, "\w+", "([^"]*)"', body).group(1)
            rows.append((name, "composite", sig, False, 1, "kNone"))
        else:
            m2 = re.match(r'\s*\w+, "\w+", k(\w+), "((?:[^"\\]|\\.)*)", \w+, (-?\d+), (\w+)', body)
            op_kind, sig, outputs, alias = m2.groups()
            rows.append((name, op_kind.lower(), sig.replace('\\"', '"'), False, int(outputs), alias))
    return rows


@pytest.mark.skipif(not os.path.exists(OPS_DEF), reason="needs the C++ sources beside the package")
def test_rows_match_ops_def():
    mine = [(r.name, r.kind, r.signature, r.inplace, r.outputs, r.alias) for r in ROWS]
    assert mine == ops_def_rows()


def test_inplace_forms_and_added_parameters():
    assert OPS["tanh_"].alias == "kMutates0" and OPS["tanh_"].params == OPS["tanh"].params
    assert "isnan_" not in OPS and "where_" not in OPS
    # op.cpp adds the cast's dtype and gelu's keyword-only approximate.
    assert [p.name for p in OPS["to"].params] == ["self", "dtype"]
    approximate = OPS["gelu"].param("approximate")
    assert approximate.keyword_only and approximate.default == "none"
    alpha = OPS["add"].param("alpha")
    assert alpha.keyword_only and alpha.default == 1
    assert OPS["amax"].param("dim").default == []
    assert OPS["zeros"].param("device").default == "cpu"


def test_every_functional_op_has_a_torch_function_for_steps_without_a_kernel():
    # kiln._torch_steps runs a step without a kernel node by node through these (on CUDA, so that
    # nothing goes through host copies); a new op needs one.
    import kiln._torch_steps as steps

    functional = [r.name for r in ROWS if not r.name.endswith("_") and r.name != "eager_call"]
    missing = []
    for name in functional:
        try:
            steps.torch_function(name)
        except NotImplementedError:
            missing.append(name)
    assert not missing
