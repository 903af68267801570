"""`make demo` runs `python -m torch_semiring demo`; it must work and print a row per token."""
import torch_semiring.__main__ as cli


def test_demo_prints_a_row_per_token(capsys):
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 6
    assert "best |path|" in out and "mean H" in out
