"""The compiled top-1 of a draft step (speclimits.control.top1op) against torch: ids equal to the first
maximum (vLLM's argmax), probabilities within 1e-5 relative, refusals where torch must decide."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from speclimits.control import top1op

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def op():
    mod = top1op.load()
    if mod is None:
        if shutil.which("c++") is None and shutil.which("g++") is None:
            pytest.skip(f"no C++ compiler: {top1op.status()['reason']}")
        pytest.fail(f"the compiled top-1 did not load: {top1op.status()['reason']}")
    return mod



def call(op, x, targets=None):
    return op.top1(x, torch.empty(0, dtype=torch.long) if targets is None else targets)


@pytest.mark.parametrize("rows,width", [(1, 4096), (4, 4096), (8, 8192), (2, 1), (5, 17)])
def test_matches_torch_and_vllms_argmax(op, rows, width):
    gen = torch.Generator().manual_seed(rows * 1000 + width)
    targets = torch.arange(width) * 3 + 2
    for scale in (0.1, 3.0, 30.0):
        x = torch.randn(rows, width, generator=gen) * scale
        for tg in (None, targets):
            ids, top = call(op, x, tg)
            ref = x.argmax(dim=-1) if tg is None else tg[x.argmax(dim=-1)]
            assert torch.equal(ids, ref)
            np.testing.assert_allclose(top, x.softmax(-1).amax(-1).tolist(), rtol=1e-5, atol=0)


def test_ties_take_the_first_maximum(op):
    x = torch.zeros(3, 10)
    x[0, [2, 7]] = 5.0
    x[1] = 1.0  # every logit tied
    x[2, [9, 0]] = 4.0
    ids, top = call(op, x)
    assert ids.tolist() == [2, 0, 0] == x.argmax(dim=-1).tolist()
    assert top[1] == pytest.approx(0.1, rel=1e-6)


def test_scattered_rows_with_minus_infinity_are_handled(op):
    """vLLM's target-vocabulary logits of an EAGLE-3 head: the head's logits among -inf."""
    gen = torch.Generator().manual_seed(7)
    x = torch.full((4, 8192), float("-inf"))
    x[:, 1::2] = torch.randn(4, 4096, generator=gen) * 4.0
    ids, top = call(op, x)
    assert ids is not None and torch.equal(ids, x.argmax(dim=-1))
    np.testing.assert_allclose(top, x.softmax(-1).amax(-1).tolist(), rtol=1e-5, atol=0)


@pytest.mark.parametrize("case", ["nan", "all -inf", "+inf", "float64", "not contiguous", "1-d", "targets short",
                                  "targets int32"])
def test_refuses_what_torch_must_decide(op, case):
    x = torch.randn(3, 64)
    targets = torch.arange(64)
    if case == "nan":
        x[1, 5] = float("nan")
    elif case == "all -inf":
        x[2] = float("-inf")
    elif case == "+inf":
        x[0, 3] = float("inf")
    elif case == "float64":
        x = x.double()
    elif case == "not contiguous":
        x = torch.randn(64, 3).t()
    elif case == "1-d":
        x = x[0]
    elif case == "targets short":
        targets = targets[:10]
    elif case == "targets int32":
        targets = targets.int()
    ids, top = call(op, x, targets)
    assert ids is None and top == []


def test_off_switch_and_status(monkeypatch):
    monkeypatch.setattr(top1op, "_STATE", {})
    monkeypatch.setenv("SPECLIMITS_TOP1_OP", "off")
    assert top1op.status() == {}
    assert top1op.load() is None
    st = top1op.status()
    assert st["compiled"] is False and "SPECLIMITS_TOP1_OP=off" in st["reason"]


def test_module_name_depends_on_the_cpu(monkeypatch):
    name = top1op.module_name()
    assert name.startswith("speclimits_top1_") and name == top1op.module_name()
    monkeypatch.setattr(top1op, "cpu_info", lambda every_flag: {"model": "another CPU", "flags": ["sse2"]})
    assert top1op.module_name() != name


def test_self_check_catches_a_wrong_op(op):
    class Wrong:
        @staticmethod
        def top1(x, targets):
            ids, top = op.top1(x, targets)
            if ids is not None and x.shape[1] == 4096:
                top = [t * 1.001 for t in top]
            return ids, top

    assert top1op.disagreement(op) is None
    assert "probabilities" in top1op.disagreement(Wrong())
