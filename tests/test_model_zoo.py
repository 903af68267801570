"""Model zoo: Hugging Face architectures built from tiny configs (no weights, no
network) run every semiring end to end.

For each architecture × attention implementation (eager and sdpa where the
model has both; convolutional and recurrent models have none) the test builds
the model from a tiny config, takes a fixed random linear readout of its first
output and runs a semiring backward to the input embeddings (``inputs_embeds``;
pixel values or audio features for vision and speech models):

* every node of the graph has a rule;
* ``real`` equals ``torch.autograd.grad``;
* every other semiring gives readouts of the right shape and dtype, free of NaN
  and finite (every input element reaches the readout), which agree with
  each other where the contract relates them: log = log(abs), viterbi =
  log(max_abs) = kmax's best, max_prod's M ≤ max_abs, |real| ≤ abs,
  viterbi ≤ log, 0 ≤ entropy ≤ log(count).

The MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) run transformers'
default experts kernel, ``torch._grouped_mm`` (GroupedMmBackward0), which has
no float64 kernel: the zoo runs in float32. A subset is compared with the
explicit-graph reference (tests/reference.py) at the end of the file.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import torch_semiring as ts
from reference import SEMIRING_NAMES, reference_values
from helpers import assert_values_equal

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModel  # noqa: E402

from helpers import assert_close_float32, node_types  # noqa: E402

K = 3  # kmax's k

_TEXT = dict(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
             max_position_embeddings=32)
_DECODER = dict(_TEXT, num_key_value_heads=1, bos_token_id=0, eos_token_id=0, pad_token_id=0)
_SEQ2SEQ = dict(vocab_size=32, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, decoder_start_token_id=0,
                pad_token_id=0, bos_token_id=0, eos_token_id=0)
_VISION = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=8,
               patch_size=4)

# model_type (AutoConfig.for_model) -> tiny config. MoE sizes are multiples of
# 4: torch._grouped_mm wants 16-byte strides.
ARCHITECTURES = {
    "bert": dict(_TEXT),
    "roberta": dict(_TEXT, pad_token_id=1),
    "xlm-roberta": dict(_TEXT, pad_token_id=1),
    "distilbert": dict(vocab_size=32, dim=16, n_layers=1, n_heads=2, hidden_dim=32, max_position_embeddings=32),
    "albert": dict(_TEXT, embedding_size=8),
    "electra": dict(_TEXT, embedding_size=8),
    "deberta": dict(_TEXT),
    "deberta-v2": dict(_TEXT, relative_attention=True, position_buckets=4, pos_att_type=["c2p", "p2c"]),
    "gpt2": dict(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=32),
    "gpt_neo": dict(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, attention_types=[[["global"], 1]],
                    max_position_embeddings=32),
    "gptj": dict(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=32, rotary_dim=4),
    "gpt_neox": dict(_DECODER),
    "opt": dict(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
                word_embed_proj_dim=16, max_position_embeddings=32),
    "llama": dict(_DECODER),
    "mistral": dict(_DECODER),
    "qwen2": dict(_DECODER),
    "qwen3": dict(_DECODER, head_dim=8),
    "gemma": dict(_DECODER, head_dim=8),
    "gemma2": dict(_DECODER, head_dim=8),
    "gemma3_text": dict(_DECODER, head_dim=8),
    "phi": dict(_DECODER),
    "phi3": dict(_DECODER),
    "olmo": dict(_DECODER),
    "olmo2": dict(_DECODER),
    "stablelm": dict(_DECODER),
    "granite": dict(_DECODER),
    "starcoder2": dict(_DECODER),
    "cohere": dict(_DECODER),
    "falcon": dict(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                   new_decoder_architecture=False, multi_query=True),
    "bloom": dict(vocab_size=32, hidden_size=16, n_layer=1, n_head=2),
    "mixtral": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(_DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=16),
    "qwen3_moe": dict(_DECODER, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
    "deepseek_v3": dict(_DECODER, num_key_value_heads=2, n_routed_experts=4, n_shared_experts=1,
                        num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=0, n_group=1,
                        topk_group=1, kv_lora_rank=8, q_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4,
                        v_head_dim=8),
    "t5": dict(vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
               decoder_start_token_id=0),
    "bart": dict(_SEQ2SEQ, max_position_embeddings=32),
    "whisper": dict(_SEQ2SEQ, num_mel_bins=4, max_source_positions=4, max_target_positions=8),
    "vit": dict(_VISION),
    "clip_vision_model": dict(_VISION, projection_dim=8),
    "swin": dict(image_size=8, patch_size=2, embed_dim=8, depths=[1], num_heads=[2], window_size=2),
    "convnext": dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], image_size=8),
    "resnet": dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
    "mamba": dict(vocab_size=32, hidden_size=16, state_size=4, num_hidden_layers=1, expand=2, conv_kernel=2),
    # RWKV's config divides by num_hidden_layers - 1: two layers.
    "rwkv": dict(vocab_size=32, hidden_size=16, num_hidden_layers=2, attention_hidden_size=16, intermediate_size=32,
                 context_length=16),
}
IMAGE_MODELS = {"vit", "clip_vision_model", "swin", "convnext", "resnet"}
ENCODER_DECODER = {"t5", "bart", "whisper"}
MOE = {"mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"}
# Models without attention layers: no attention implementation to choose.
NO_ATTENTION = {"convnext", "resnet", "mamba", "rwkv"}
# transformers 5.23 implements only eager attention for these.
EAGER_ONLY = {"deberta", "deberta-v2", "gpt_neo", "gptj", "gemma2", "bloom"}


def _variants(name: str) -> list[str]:
    if name in NO_ATTENTION:
        return ["none"]
    return ["eager"] if name in EAGER_ONLY else ["eager", "sdpa"]


CASES = [(name, attn) for name in ARCHITECTURES for attn in _variants(name)]


def build(name: str, attn: str, dtype=torch.float32, **overrides):
    torch.manual_seed(0)
    config = AutoConfig.for_model(name, **{**ARCHITECTURES[name], **overrides})
    kwargs = {} if attn == "none" else {"attn_implementation": attn}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModel.from_config(config, **kwargs).to(dtype).eval()
    if attn != "none":
        assert model.config._attn_implementation == attn, f"{name}: asked for {attn} attention"
    return model


def forward(model, name: str, dtype=torch.float32, tokens: int = 5):
    """(differentiable input, first output) of one forward pass."""
    g = torch.Generator().manual_seed(1)
    if name in IMAGE_MODELS:
        x = torch.randn(1, 3, 8, 8, generator=g, dtype=dtype).requires_grad_()
        return x, model(pixel_values=x)[0]
    if name == "whisper":  # 2 · max_source_positions frames of num_mel_bins features
        x = torch.randn(1, 4, 8, generator=g, dtype=dtype).requires_grad_()
        return x, model(input_features=x, decoder_input_ids=torch.tensor([[0, 3, 5]]))[0]
    ids = torch.tensor([[1, 5, 7, 2, 9, 4][:tokens]])
    x = model.get_input_embeddings()(ids).detach().requires_grad_()
    extra = {"decoder_input_ids": torch.tensor([[0, 3, 5]])} if name in ENCODER_DECODER else {}
    if name == "rwkv":  # its cached state is updated in place, which breaks even stock autograd
        extra["use_cache"] = False
    return x, model(inputs_embeds=x, **extra)[0]


def readout(hidden: torch.Tensor) -> torch.Tensor:
    """A fixed random linear readout: a scalar that every output element feeds."""
    probe = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(2), dtype=hidden.dtype)
    return (hidden * probe).sum()


@pytest.mark.parametrize("name,attn", CASES, ids=[f"{n}-{a}" for n, a in CASES])
def test_architecture_runs_every_semiring(name, attn):
    model = build(name, attn)
    x, hidden = forward(model, name)
    out = readout(hidden)
    missing = sorted(n for n in node_types(out) if not ts.has_rule(n))
    assert not missing, f"{name}: no semiring rule for {missing}"
    if name in MOE:  # transformers' default experts kernel is the one under test
        assert "GroupedMmBackward0" in node_types(out), f"{name}: expected torch._grouped_mm experts"

    (real,) = ts.grad(out, x, retain_graph=True)
    (stock,) = torch.autograd.grad(out, x, retain_graph=True)
    torch.testing.assert_close(real, stock, rtol=1e-5, atol=1e-6, msg=f"{name}-{attn}: real != autograd")

    others = [s for s in SEMIRING_NAMES if s != "real"]
    values = dict(zip(others, ts.grad(out, x, semiring=tuple(others), k=K)))
    for semiring, (v,) in values.items():
        shape = (*x.shape, K) if semiring == "kmax" else x.shape
        assert v.shape == shape and v.dtype == x.dtype, f"{name}-{attn}/{semiring}: {v.shape} {v.dtype}"
        assert not v.isnan().any(), f"{name}-{attn}/{semiring}: NaN"
        best = v[..., 0] if semiring == "kmax" else v
        assert torch.isfinite(best).all(), f"{name}-{attn}/{semiring}: an input element without a path"
    _check_relations(values, real, f"{name}-{attn}")


def _check_relations(v: dict, real: torch.Tensor, what: str) -> None:
    """What the contract ties together, at float32 precision."""
    (abs_,), (count,), (log,), (max_abs,), (vit,), (max_prod,), (ent,), (kmax,) = (
        v[s] for s in ("abs", "count", "log", "max_abs", "viterbi", "max_prod", "entropy", "kmax"))
    close = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(log, abs_.log(), msg=f"{what}: log != log(abs)", **close)
    torch.testing.assert_close(vit, max_abs.log(), msg=f"{what}: viterbi != log(max_abs)", **close)
    torch.testing.assert_close(kmax[..., 0], vit, msg=f"{what}: kmax's best != viterbi", **close)
    assert (kmax[..., :-1] >= kmax[..., 1:]).all(), f"{what}: kmax not descending"
    slack = 1 + 1e-4
    assert (vit <= log + 1e-4).all(), f"{what}: best path above the sum"
    assert (max_prod <= max_abs * slack + 1e-6).all(), f"{what}: max_prod above max_abs"
    assert (real.abs() <= abs_ * slack + 1e-6).all(), f"{what}: |real| above abs"
    assert (count >= 1).all(), f"{what}: count below one path"
    assert (ent >= -1e-4).all() and (ent <= count.log() + 1e-3).all(), f"{what}: entropy out of [0, log count]"


def test_the_zoo_covers_at_least_35_architectures():
    assert len(ARCHITECTURES) >= 35 and len(CASES) >= 60


# ---- a subset against the explicit-graph reference -------------------------
# Bloom (the GeLUFunction declared pointwise) in float64; Mixtral (GroupedMm,
# float32 only) in float32: its edge weights are exact float32 values (one-hot
# backward calls) and the reference sums them in float64, so the values agree
# to float32 precision.
SMALL = dict(hidden_size=8, intermediate_size=8, num_attention_heads=2)
REFERENCE = [("bloom", torch.float64, dict(hidden_size=8)),
             ("mixtral", torch.float32, dict(SMALL, num_key_value_heads=1)),
             ("phi", torch.float64, dict(SMALL, num_key_value_heads=1))]


@pytest.mark.parametrize("semiring", SEMIRING_NAMES)
@pytest.mark.parametrize("name,dtype,sizes", REFERENCE, ids=[r[0] for r in REFERENCE])
def test_small_models_match_reference(name, dtype, sizes, semiring):
    model = build(name, "eager", dtype=dtype, **sizes)
    x, hidden = forward(model, name, dtype=dtype, tokens=3)
    out = readout(hidden)
    expected = reference_values(out, [x], semiring, k=K)[0]
    (actual,) = ts.grad(out, x, semiring=semiring, **({"k": K} if semiring == "kmax" else {}))
    what = f"{name}/{semiring}"
    # Phi's rotary embedding computes in float32 even in a float64 model (a
    # ToCopyBackward0 in the graph; `real` still equals autograd exactly), so
    # edge weights read one element at a time round differently, as Llama's
    # RMSNorm in test_transformers: compare at float32 precision.
    if dtype == torch.float64 and name != "phi":
        assert_values_equal(actual, expected, semiring, what)
    else:
        assert_close_float32(actual.double(), expected, what)
