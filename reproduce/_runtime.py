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


def script_parser(doc, here):
    """The options both scripts have: --smoke (tiny sizes) and --out."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds); results go to --out")
    parser.add_argument("--out", default=os.path.join(here, "results"))
    return parser


def save_figure(fig, path):
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
