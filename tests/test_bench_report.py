"""scripts/bench.py's target lines: issue 9's targets were set for one CPU thread, so only a CPU run is judged."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench import target_lines  # noqa: E402

RATES = {"trunk": 1000.0, "trunk+notebook": 800.0, "mamba": 900.0, "llama": 400.0}  # cost 1.25x: met
DECODING = {(name, n): (seconds, 0, [seconds]) for n in (1024, 16384)
            for name, seconds in (("trunk+notebook", 1e-4), ("llama", 1e-3))}
STREAMING = {1000: {"peak_bytes": 100}, 1_000_000: {"peak_bytes": 150}}


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_targets_are_judged_on_a_cpu_only(device):
    lines = "\n".join(target_lines(RATES, DECODING, [1024, 16384], STREAMING, device))
    assert "1.25x the bare trunk" in lines and "10.00x faster per byte" in lines and "memory: 1.50x" in lines
    if device == "cpu":
        assert "## Targets (issue 9)" in lines
        assert lines.count(": met)") == 5 and lines.count(": missed)") == 1  # the Mamba is faster: missed
    else:
        assert "set for one CPU thread" in lines and ": met)" not in lines and ": missed)" not in lines
        assert lines.count("not judged on cuda:0") == 6
