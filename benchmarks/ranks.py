"""Run one benchmark script as the ranks of a local gloo job (the environment torchrun sets).

Shared by dataset_scaling.py and tp_backward.py: every rank is `script --rank-run ARGS`, one thread,
Hugging Face offline, this checkout's package first on the path; rank 0's last stdout line is JSON.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str, ranks: int, args: list[str]) -> dict:
    """Rank 0's JSON result, with ``wall_s``: the whole job's seconds (start-up included)."""
    port = free_port()
    argv = [sys.executable, os.path.abspath(script), "--rank-run", *args]
    start = time.perf_counter()
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                                       PYTHONPATH=os.path.join(ROOT, "python")))
             for r in range(ranks)]
    outs = [p.communicate() for p in procs]
    wall = time.perf_counter() - start
    for p, (_, stderr) in zip(procs, outs):
        if p.returncode:
            raise SystemExit(f"a rank failed:\n{stderr[-3000:]}")
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    result["wall_s"] = wall
    return result
