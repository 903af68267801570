"""What both reproduction scripts share: run single-threaded (reproducible and
kind to a shared machine), restoring torch's thread count for in-process
callers such as tests/test_reproduce.py."""
import torch


def single_threaded(run, argv=None):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(argv)
    finally:
        torch.set_num_threads(threads)
