"""Small models for the preload tests and the overhead benchmark: an MLP, a
hand-written attention block, tiny BERT and tiny Llama (float64, eval, seeded)."""
from __future__ import annotations

import math

import torch


def mlp():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    return x, list(net.parameters()), lambda: net(x).sum()


class Attention(torch.nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))
        self.norm = torch.nn.LayerNorm(d)
        self.out = torch.nn.Linear(d, 1)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(x.shape[-1])
        h = self.norm(x + torch.softmax(scores, dim=-1) @ self.v(x))
        return self.out(torch.nn.functional.gelu(h)).sum()


def attention():
    torch.manual_seed(0)
    block = Attention().double()
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    return x, list(block.parameters()), lambda: block(x)


def _transformer(family: str, attn: str = "eager", hidden: int = 8, layers: int = 1):
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    if family == "bert":
        cfg = BertConfig(vocab_size=20, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                         intermediate_size=2 * hidden, max_position_embeddings=16, attn_implementation=attn)
        model = BertModel(cfg, add_pooling_layer=False)
    else:
        cfg = LlamaConfig(vocab_size=20, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
                          attn_implementation=attn)
        model = LlamaModel(cfg)
    model = model.double().eval()
    ids = torch.tensor([[1, 5, 7, 2, 9]])
    x = model.get_input_embeddings()(ids).detach().requires_grad_()
    params = [p for p in model.parameters() if p.requires_grad]
    return x, params, lambda: model(inputs_embeds=x).last_hidden_state[0, 0].sum()


def bert(attn: str = "eager"):
    return _transformer("bert", attn)


def llama(attn: str = "sdpa"):
    return _transformer("llama", attn)


MODELS = {"mlp": mlp, "attention": attention, "bert": bert, "llama": llama}
