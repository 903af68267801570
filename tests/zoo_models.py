"""The model zoo's tiny Hugging Face models (no weights, no network), shared by test_model_zoo.py and
test_grouped_mm.py: tiny configs per model_type, building, a forward to the first output, a fixed readout."""
from __future__ import annotations

import warnings

import torch
from transformers import AutoConfig, AutoModel

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


def _randn(*shape, generator, dtype):
    """torch.randn drawn in float32 (float64 for float64) and cast: a reduced-precision draw gives other
    numbers on some torch versions (2.11 draws bf16 by a vectorised path of its own), and the GPU tests
    compare a bf16 graph with the float32 one on the same inputs."""
    base = torch.float64 if dtype == torch.float64 else torch.float32
    return torch.randn(*shape, generator=generator, dtype=base).to(dtype)


def forward(model, name: str, dtype=torch.float32, tokens: int = 5):
    """(differentiable input, first output) of one forward pass, on the model's device (the same
    numbers on every device: the inputs are drawn on the CPU)."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(1)
    if name in IMAGE_MODELS:
        x = _randn(1, 3, 8, 8, generator=g, dtype=dtype).to(device).requires_grad_()
        return x, model(pixel_values=x)[0]
    decoder_ids = torch.tensor([[0, 3, 5]], device=device)
    if name == "whisper":  # 2 · max_source_positions frames of num_mel_bins features
        x = _randn(1, 4, 8, generator=g, dtype=dtype).to(device).requires_grad_()
        return x, model(input_features=x, decoder_input_ids=decoder_ids)[0]
    ids = torch.tensor([[1, 5, 7, 2, 9, 4][:tokens]], device=device)
    x = model.get_input_embeddings()(ids).detach().requires_grad_()
    extra = {"decoder_input_ids": decoder_ids} if name in ENCODER_DECODER else {}
    if name == "rwkv":  # its cached state is updated in place, which breaks even stock autograd
        extra["use_cache"] = False
    return x, model(inputs_embeds=x, **extra)[0]


def readout(hidden: torch.Tensor) -> torch.Tensor:
    """A fixed random linear readout: a scalar that every output element feeds."""
    probe = _randn(*hidden.shape, generator=torch.Generator().manual_seed(2), dtype=hidden.dtype)
    return (hidden * probe.to(hidden.device)).sum()
