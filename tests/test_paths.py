"""Top gradient paths: correctness against brute-force enumeration, labels on a
tiny BERT, component flow, every export, and the explain CLI."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

import torch_semiring as ts
from helpers import all_paths, assert_explain_fails, attention_by_hand, flat_index, mlp3, pointwise_broadcast, score, tiny

D = torch.float64


def leaf(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=D).requires_grad_()


def small_graph():
    x, w = leaf(2, 3, seed=1), leaf(3, 2, seed=2)
    return ((x @ w).tanh() * x[:, :2]).sum() + (x * x).sum(), [x, w]


def tiny_cnn():
    g = torch.Generator().manual_seed(3)
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(2, 2, 2), nn.AvgPool2d(1), nn.Flatten(), nn.Linear(2, 1)).double().eval()
    for p in net.parameters():
        p.data = torch.randn(p.shape, generator=g, dtype=torch.float64)
    net[1].running_var.fill_(0.7)
    x = torch.randn(1, 1, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    return net(x).sum(), [x, net[0].weight]


@pytest.mark.parametrize("semiring,k", [("viterbi", 1), ("max_abs", 1), ("max_prod", 1), ("kmax", 3), ("viterbi", 4),
                                        ("min_plus", 1)])
@pytest.mark.parametrize("case", ["small", "broadcast", "mlp", "attention", "cnn"])
def test_top_paths_match_brute_force(case, semiring, k):
    build = {"small": small_graph, "broadcast": lambda: pointwise_broadcast()[:2],
             "mlp": lambda: mlp3()[:2], "attention": lambda: attention_by_hand()[:2], "cnn": tiny_cnn}[case]
    out, inputs = build()
    if isinstance(out, list):
        out = sum(o.sum() for o in out)
    elif out.numel() != 1:
        out = out.sum()
    enumerated = all_paths(out, inputs)
    kind = "kmax" if k > 1 else semiring
    best = sorted((score(kind, w) for _, _, w in enumerated), reverse=kind != "min_plus")[:k]
    paths = ts.top_paths(out, inputs, semiring=semiring, k=k)
    assert [p.rank for p in paths] == list(range(len(best)))
    for p, expected in zip(paths, best):
        assert p.value == pytest.approx(expected, rel=1e-9, abs=1e-12)
        weights = [s.edge_weight for s in p.steps[:-1]]
        assert p.steps[-1].edge_weight is None
        assert score(kind, weights) == pytest.approx(p.value, rel=1e-9, abs=1e-12)  # value = ⊗ of its edges
        start = flat_index(p.steps[0])
        matches = [w for i, f, w in enumerated if i == p.input and f == start and len(w) == len(weights)
                   and all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(w, weights))]
        assert matches, f"path #{p.rank} is not a path of the graph: {weights}"
    # the path value equals the semiring readout at its input element
    readouts = ts.grad(out, inputs, semiring=kind, retain_graph=True, **({"k": k} if kind == "kmax" else {}))
    top = paths[0]
    r = readouts[top.input].reshape(-1, k)[flat_index(top.steps[0])] if kind == "kmax" else \
        readouts[top.input].reshape(-1)[flat_index(top.steps[0])]
    assert float(r if kind != "kmax" else r[0]) == pytest.approx(top.value, rel=1e-12)


def tiny_bert_run(track=True):
    model = tiny("bert", "eager", layers=2, dropout=0.0).double().eval()
    ids = torch.tensor([[2, 5, 7, 3, 9]])
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    if track:
        with ts.track_modules(model):
            result = model(inputs_embeds=embeds, output_hidden_states=True)
    else:
        result = model(inputs_embeds=embeds, output_hidden_states=True)
    return model, embeds, result.logits[0, 1], result.hidden_states


def test_labels_on_a_tiny_bert():
    model, embeds, out, _ = tiny_bert_run()
    paths = ts.top_paths(out, embeds, semiring="viterbi", k=3, model=model, seq_len=5)
    (vit,) = ts.grad(out, embeds, semiring="viterbi", retain_graph=True)
    assert paths[0].value == pytest.approx(float(vit.max()), rel=1e-12)
    for p in paths:
        first, last = p.steps[0], p.steps[-1]
        assert first.node == "leaf" and first.shape == (1, 5, 8) and first.token == first.index[1]
        assert last.shape == () and last.value == 0.0  # log 1 at the output
        modules = [s.module for s in p.steps if s.module]
        assert any(m.startswith("bert.encoder.layer.") for m in modules)
        assert all(s.token is not None for s in p.steps if len(s.shape) == 3 and s.shape[1] == 5)
    # attention tensors (batch, heads, tokens, ·) decode head and token
    heads = [s for p in ts.top_paths(out, embeds, semiring="viterbi", k=20, model=model, seq_len=5)
             for s in p.steps if s.head is not None]
    for s in heads:
        assert s.shape[1] == 2 and s.index[1] == s.head and s.index[2] == s.token


def count_reads(monkeypatch, run):
    """run() with every host read of one element (.item(), float(t), int(t): each a sync on a GPU)
    forbidden; returns its result and the sizes of the .tolist() reads it made."""
    reads = []

    def forbidden(self, *args):
        raise AssertionError("a host read of one element while walking paths")

    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "item", forbidden)
    monkeypatch.setattr(torch.Tensor, "__float__", forbidden)
    monkeypatch.setattr(torch.Tensor, "__int__", forbidden)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.numel()) or tolist(self))
    try:
        return run(), reads
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("k", [1, 4])
def test_walked_paths_read_the_device_once_per_step(monkeypatch, k):
    # Paths taken from a walk's records (k = 1; k > 1 on a graph with hooks, by the
    # kmax+paths walk) are walked in lockstep: one transfer per step, plus one
    # for the candidates and one for all edge weights.
    model, embeds, out, _ = tiny_bert_run()
    hooked = out.register_hook(lambda g: None) if k > 1 else None
    expected = ts.top_paths(out, embeds, semiring="viterbi", k=k, model=model, seq_len=5)
    paths, reads = count_reads(monkeypatch, lambda: ts.top_paths(out, embeds, semiring="viterbi", k=k,
                                                                 model=model, seq_len=5))
    if hooked is not None:
        hooked.remove()
    assert [p.to_dict() for p in paths] == [p.to_dict() for p in expected]
    longest = max(len(p.steps) for p in paths)
    assert len(reads) == longest + 2, reads  # candidates, one per step, edge weights
    assert reads[1] == 2 * len(paths)  # the first step reads (score, id) of every path at once


def test_k_best_paths_read_whole_columns(monkeypatch):
    # The lazy k best (k_best.py) reads (score, id) pairs of the elements it reaches, the candidate
    # columns of an element it expands, and the paths' links in lockstep: never a single element.
    model, embeds, out, _ = tiny_bert_run()
    expected = ts.top_paths(out, embeds, semiring="viterbi", k=4, model=model, seq_len=5)
    paths, reads = count_reads(monkeypatch, lambda: ts.top_paths(out, embeds, semiring="viterbi", k=4,
                                                                 model=model, seq_len=5))
    assert [p.to_dict() for p in paths] == [p.to_dict() for p in expected]
    assert reads[0] == 3 * 4  # the candidate starts: (score, index, exists) of each
    assert all(n % 2 == 0 for n in reads[1:-1]), reads  # (score, id) pairs / k-lists of (score, id)


def test_parameters_are_labelled_by_name():
    model, embeds, out, _ = tiny_bert_run()
    weight = model.bert.encoder.layer[0].attention.self.query.weight
    (p,) = ts.top_paths(out, weight, semiring="max_abs", model=model)
    assert p.steps[0].module == "bert.encoder.layer.0.attention.self.query.weight"


def test_component_flow_on_a_tiny_bert():
    model, embeds, out, hidden = tiny_bert_run()
    flow = ts.component_flow(out, {"layer 0": hidden[0], "layer 1": hidden[1]})
    assert list(flow.columns) == ["layer", "batch", "token", "branch", "value", "consumer"]
    assert len(flow) == 2 * 5
    assert set(flow["branch"]) <= {"query", "key", "value", "skip", "mlp"}
    (vit0,) = ts.grad(out, hidden[0], semiring="viterbi", retain_graph=True)
    first = flow[flow["layer"] == "layer 0"].sort_values("token")["value"].tolist()
    assert first == pytest.approx(vit0[0].amax(-1).tolist(), rel=1e-12)
    assert all(c is None or c.startswith("bert.") for c in flow["consumer"])


def test_dataset_flow_concatenates_examples():
    model = tiny("bert", "eager", layers=2, dropout=0.0).double().eval()

    def forward(ids):
        with ts.track_modules(model):
            result = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        return result.logits[0, 1], {"layer 0": result.hidden_states[0], "layer 1": result.hidden_states[1]}

    flow = ts.dataset_flow([[2, 5, 7], [3, 9, 4, 4]], forward, progress=False)
    assert flow["example"].tolist().count(0) == 2 * 3 and flow["example"].tolist().count(1) == 2 * 4
    alone = ts.component_flow(*forward([3, 9, 4, 4]))
    assert flow[flow["example"] == 1]["value"].tolist() == pytest.approx(alone["value"].tolist(), rel=1e-12)


def test_exports(tmp_path):
    from torch_semiring.render import heatmap, render_paths

    model, embeds, out, hidden = tiny_bert_run()
    paths = ts.top_paths(out, embeds, k=2, model=model, seq_len=5)
    d = paths[0].to_dict()
    assert json.loads(paths[0].to_json())["value"] == d["value"] and len(d["steps"]) == len(paths[0].steps)
    frame = paths[0].to_dataframe()
    assert len(frame) == len(paths[0].steps) and {"node", "module", "edge_weight", "value"} <= set(frame.columns)
    graph = paths[0].to_networkx()
    assert graph.number_of_nodes() == len(paths[0].steps) and graph.number_of_edges() == len(paths[0].steps) - 1
    svg, png = render_paths(paths, str(tmp_path / "paths"))
    assert open(svg).read().lstrip().startswith("<?xml") and open(png, "rb").read(4) == b"\x89PNG"
    flow = ts.component_flow(out, {"layer 0": hidden[0], "layer 1": hidden[1]})
    pic = heatmap(flow, "value", str(tmp_path / "flow.png"), "flow", annotate="branch")
    assert open(pic, "rb").read(4) == b"\x89PNG"


def test_bad_inputs():
    x = leaf(3)
    with pytest.raises(ValueError, match="has no paths.*kmax, max_abs, max_prod, min_plus, viterbi"):
        ts.top_paths((x * 2).sum(), x, semiring="entropy")  # the selecting semirings, asked, not listed
    with pytest.raises(ValueError, match="scalar output or grad_outputs"):
        ts.top_paths(x * 2, x)
    with pytest.raises(ValueError, match="k > 1"):
        ts.top_paths((x * 2).sum(), x, semiring="max_prod", k=2)
    assert len(ts.top_paths(x * 2, x, grad_outputs=[torch.ones(3, dtype=D)], k=2)) == 2


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory):
    from transformers import BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_bert")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
    (folder / "vocab.txt").write_text("\n".join(words + [f"w{i}" for i in range(20 - len(words))]) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    model = tiny("bert", "eager", layers=2, dropout=0.0).bert
    model.config.max_position_embeddings = 16
    model.save_pretrained(folder)
    return str(folder)


def test_explain_cli_writes_table_json_and_pictures(tiny_model_folder, tmp_path, capsys):
    from torch_semiring.__main__ import main

    out = tmp_path / "explain"
    assert main(["explain", "--model", tiny_model_folder, "--text", "the cat sat on the mat",
                 "--other", "a dog", "--k", "3", "--out", str(out), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert "top 3 viterbi paths" in printed and "layer 1" in printed
    for name in ["top_paths.csv", "top_paths.json", "component_flow.png", "entropy.png", "top_paths.svg",
                 "top_paths.png"]:
        assert (out / name).stat().st_size > 0, name
    saved = json.loads((out / "top_paths.json").read_text())
    assert len(saved["paths"]) == 3 and saved["tokens"][0] == "[CLS]"


def test_explain_cli_errors(tiny_model_folder, tmp_path, capsys):
    # Every bad argument: one line on stderr, exit status 2, before any work.
    from torch_semiring.__main__ import main

    def fails(extra, message, model=tiny_model_folder):
        assert_explain_fails(capsys, model, tmp_path / "out", extra, message)

    fails([], "unknown model 'nope'", model="nope")
    (tmp_path / "empty").mkdir()
    fails([], "has no config.json: not a Hugging Face model folder", model=str(tmp_path / "empty"))
    fails(["--text", "the cat " * 20], "more than the model's maximum of 16")
    fails(["--semiring", "entropy"], "has no paths")
    for k in ("0", "-3", "100000"):
        fails(["--k", k], f"--k must be a whole number from 1 to 64 .*got {k}")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit) as exited:
        main(["explain", "--model", tiny_model_folder, "--out", str(tmp_path / "a_file" / "out")])
    assert exited.value.code == 2 and "is not a writable folder" in capsys.readouterr().err
    fails(["--device", "tpu0"], "'tpu0' is not a torch device")
    fails(["--device", "meta"], "meta holds no data")
    if not torch.cuda.is_available():
        fails(["--device", "cuda"], "no CUDA device.*--device cpu")
