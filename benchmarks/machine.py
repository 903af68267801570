"""What the benchmarks say about where they ran: one thread, and the torch, machine, kernel ISA and date.

Shared by gemm_kernels.py, norm_rows.py, profile_rules.py and run.py, so every table carries the same facts.
"""
from __future__ import annotations

import platform
import time

import torch


def machine() -> str:
    """The processor (or, where Python cannot tell, the architecture)."""
    return platform.processor() or platform.machine()


def stamp() -> str:
    """The date and minute of the run."""
    return time.strftime("%Y-%m-%d %H:%M")


def one_thread_header(*details: str) -> str:
    """Set torch to one thread; the header line: torch, machine, kernel ISA, 1 thread, date, then `details`."""
    from torch_semiring import _C

    torch.set_num_threads(1)
    return ", ".join([f"torch {torch.__version__}", machine(), f"kernel ISA {_C.kernel_isa()}", "1 thread", stamp(),
                      *details])
