"""Semiring backward through torch.distributed, on 2 and 4 gloo processes on the CPU (issue 20).

Each launch starts the ranks of one gloo job (tests/distributed_cases.py, the environment torchrun
would set) and runs every case in it, every semiring; each test compares what every rank computed with
the same model run in this one process. Launches are shared per world size and bounded in time.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch

import distributed_cases as cases
import torch_semiring as ts

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LAUNCH_TIMEOUT = 420  # seconds for one launch (all cases, all semirings); ~30-60 s on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict:
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=os.path.join(ROOT, "python"))
    return env


def launch(world: int, case_names, out_dir: str, timeout: float = LAUNCH_TIMEOUT) -> list[dict]:
    """Runs the cases on `world` processes; every rank's results (rank order). Kills the ranks it started
    when the launch runs past `timeout` or one rank fails."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "distributed_cases.py"), out_dir, *case_names],
                              env=rank_env(r, world, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
             for r in range(world)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the {world}-rank launch of {case_names} ran past {timeout} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    failed = [(r, p.returncode, log) for r, (p, log) in enumerate(zip(procs, logs)) if p.returncode]
    assert not failed, "\n".join(f"rank {r} exited with {rc}:\n{log[-4000:]}" for r, rc, log in failed)
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world)]


ALL_CASES = ("oplus", "collectives", "errors", *cases.MODELS)


@pytest.fixture(scope="module", params=[2, 4], ids=["2 ranks", "4 ranks"])
def job(request, tmp_path_factory):
    world = request.param
    return world, launch(world, ALL_CASES, str(tmp_path_factory.mktemp(f"ranks{world}")))


# Log-space sums (log, entropy, kmax) go through exp-shifted GEMMs whose shifts depend on the operands'
# blocking: a DTensor layer's gathered weight and the single-process weight round differently (seen: 1e-8
# relative on a Llama's q_proj weight, log). Everything else agrees to rounding.
LOG_SPACE_RTOL = 1e-7


def assert_same(actual, expected, what: str) -> None:
    assert actual is not None, f"{what}: no value"
    rtol = LOG_SPACE_RTOL if any(f"/{s}" in what or what.startswith(s) for s in ("log", "entropy", "kmax")) else 1e-10
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=1e-12, equal_nan=True, msg=lambda m: f"{what}: {m}")


def test_oplus_across_ranks(job):
    """all_reduce_oplus = the semiring's own ⊕ over every rank's value: each kind of ⊕ (sum, max, max/min,
    log-sum-exp, entropy's (ℓ, h) merge, kmax's top-k merge), a product, a Python semiring; zeros, ties,
    sign changes, magnitudes 1e±30."""
    world, ranks = job
    expected = cases.expected_oplus(world)
    for rank, result in enumerate(ranks):
        for name in cases.OPLUS_SEMIRINGS:
            assert_same(result["oplus"][name], expected[name], f"{name}, rank {rank}")


def test_collective_backward_nodes(job):
    """Functional all_reduce / all_gather / reduce_scatter (and their wait), torch.distributed.nn
    all_reduce / broadcast / all_gather: each rank's readout = the single-process graph with one copy of
    the output per rank, every semiring."""
    world, ranks = job
    expected = cases.expected_collectives(world)
    for rank, result in enumerate(ranks):
        for kind in cases.COLLECTIVES:
            for name in cases.SEMIRINGS:
                assert_same(result["collectives"][f"{kind}/{name}"], expected[f"{kind}/{name}/{rank}"],
                            f"{kind}, {name}, rank {rank}")


@pytest.mark.parametrize("model", cases.MODELS)
def test_tensor_parallel_model(job, model):
    """parallelize_module (Colwise/RowwiseParallel; SequenceParallel around a LayerNorm; a tiny Llama):
    ts.grad w.r.t. the input and .backward() into every (DTensor) parameter give on every rank the
    single-process readouts, every semiring."""
    world, ranks = job
    expected = cases.expected_model(model, world)
    for rank, result in enumerate(ranks):
        got = result[model]
        for key, value in got.items():
            want = expected.get(f"{key}/{rank}", expected.get(key))
            assert_same(value, want, f"{key}, rank {rank}")
        missing = {k.rsplit("/", 1)[0] if k.rsplit("/", 1)[-1].isdigit() else k for k in expected} - set(got)
        assert not missing, f"rank {rank} has no {sorted(missing)}"


def test_single_process_mlp_matches_the_reference():
    """The single-process readouts the distributed runs are held to are themselves the explicit-graph
    reference's (tests/reference.py), on the MLP."""
    import reference

    m, x, _ = cases.build("mlp")
    x = x.clone().requires_grad_()
    for name in cases.SEMIRINGS:
        (got,) = ts.grad(m(x), x, semiring=name, **cases.params(name))
        (want,) = reference.reference_values(m(x), [x], semiring=name, k=cases.K)
        assert_same(got, want.to(got.dtype), name)


def test_refusals_are_clear_and_on_every_rank(job):
    world, ranks = job
    for rank, result in enumerate(ranks):
        messages = result["errors"]["messages"]
        assert "Partial" in messages.get("partial", ""), messages
        assert "Redistribute" in messages["partial"]
        assert "path extraction" in messages.get("paths", ""), messages
        assert "'max'" in messages.get("max", "") and "sum" in messages["max"], messages


def test_rules_registered_as_collective_family():
    rules = ts.registered_rules()
    for name in ("_ToTorchTensorBackward", "_FromTorchTensorBackward", "RedistributeBackward",
                 "_AllReduceBackward", "GeneratedBackwardFor__c10d_functional_all_reduce_defaultBackward"):
        assert rules[name] == "collective"


# ---- sharded datasets ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    import distributed_dataset

    return distributed_dataset.make_model_folder(str(tmp_path_factory.mktemp("tiny_bert")))


def run_ranks(world: int, argv: list[str], timeout: float = LAUNCH_TIMEOUT) -> list[tuple[int, str, str]]:
    """`python argv…` as the ranks of a gloo job: (exit status, stdout, stderr) per rank, each captured
    apart (what rank 0 prints cannot mix with what the others print)."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, *argv], env=rank_env(r, world, port), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for r in range(world)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append((p.returncode, stdout, stderr))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{argv} on {world} ranks ran past {timeout} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (rc, stdout, stderr) in enumerate(out):
        assert rc == 0, f"rank {r} exited with {rc}:\n{stdout[-2000:]}\n{stderr[-4000:]}"
    return out


def test_dataset_flow_sharded_equals_serial(tiny_bert, tmp_path):
    """ts.dataset_flow on 2 ranks (each every other sentence, gathered on rank 0) = the serial run; the
    progress bar shows on rank 0 only."""
    import pickle

    import distributed_dataset
    from torch_semiring.explain_dataset import explain_dataset

    out = tmp_path / "flow.pkl"
    ranks = run_ranks(2, [os.path.join(HERE, "distributed_dataset.py"), tiny_bert, str(out)])
    with open(out, "rb") as f:
        sharded = pickle.load(f)
    serial = explain_dataset(tiny_bert, distributed_dataset.SENTENCES, distributed_dataset.OTHER, progress=False)
    assert sorted(set(sharded["example"])) == list(range(len(distributed_dataset.SENTENCES)))
    assert_frames_equal(sharded, serial)
    assert "component flow" in ranks[0][2], ranks[0][2][-2000:]
    assert "component flow" not in ranks[1][2], ranks[1][2][-2000:]


def assert_frames_equal(a, b) -> None:
    import pandas as pd

    assert list(a.columns) == list(b.columns)
    exact = [c for c in a.columns if c != "value"]
    pd.testing.assert_frame_equal(a[exact].reset_index(drop=True), b[exact].reset_index(drop=True))
    torch.testing.assert_close(torch.tensor(a["value"].to_numpy()), torch.tensor(b["value"].to_numpy()),
                               rtol=1e-10, atol=1e-12)


def test_explain_dataset_cli_under_torchrun(tiny_bert, tmp_path):
    """`torchrun --nproc-per-node 2 -m torch_semiring explain-dataset` writes the same table as the
    serial command (rank 0 writes it)."""
    import json

    import distributed_dataset
    import pandas as pd

    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(distributed_dataset.SENTENCES) + "\n")
    common = ["-m", "torch_semiring", "explain-dataset", "--model", tiny_bert, "--data", str(data),
              "--other", distributed_dataset.OTHER, "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=os.path.join(ROOT, "python"))
    sharded, serial = tmp_path / "sharded.json", tmp_path / "serial.json"
    for argv, out, ranks in (([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--master-port", str(free_port())], sharded, 2), ([sys.executable], serial, 1)):
        done = subprocess.run(argv + common + ["--out", str(out)], env=env, cwd=ROOT, capture_output=True,
                              text=True, timeout=LAUNCH_TIMEOUT)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        assert f"{len(distributed_dataset.SENTENCES)} sentences" in done.stdout, done.stdout
        assert f"{ranks} rank(s)" in done.stdout, done.stdout
    frames = [pd.DataFrame(json.loads(p.read_text())) for p in (sharded, serial)]
    assert_frames_equal(*frames)
