"""The memory planner against the peaks measured on the GPU (`python -m bench.calibrate`, rows in
bench/runs/): a change to training/step/memory.py that breaks the calibration fails here."""

from __future__ import annotations

import pytest

from bench.calibrate import band, fit, label, recorded_rows
from training.step import memory
from tests.conftest import REPO

ROWS = recorded_rows(sorted((REPO / "bench/runs").rglob("*.json")))


@pytest.mark.skipif(not ROWS, reason="no calibration rows recorded yet: run `bash "
                    "bench/device-run.sh trust` on the GPU machine and commit calibration.json")
@pytest.mark.parametrize("row", ROWS, ids=label)
def test_estimate_is_within_10_percent_or_at_most_15_percent_over_the_measured_peak(row):
    # LoRA rows: at most 5% over (`band`)
    error = memory.estimate_from(row["inputs"]) / (row["peak_gib"] * memory.GIB) - 1
    low, high = band(row)
    assert low <= error <= high, (f"{label(row)}: estimate {error:+.1%} against the measured "
                                  f"{row['peak_gib']:.2f} GiB; refit with `python -m "
                                  "bench.calibrate --fit FILES`")


def _inputs(micro: int, compiled: bool, checkpointing: bool) -> dict:
    """A full fine-tuning row; with checkpointing a 512-token loss chunk, so that the recompute
    (the factor's moment), not the loss, is the peak of most rows."""
    return {"model": "qwen2.5-1.5b", "vocab_size": 151936, "num_params": 1_543_714_304,
            "shard_size": 1, "world": 1, "compiled": compiled, "micro_batch": micro,
            "seq_len": 2048, "grad_accum": 1 + micro % 3, "reduce_dtype": "bf16",
            "accum_dtype": None, "checkpointing": checkpointing, "zero2": micro % 2 == 0,
            "loss_chunk_tokens": 512 if checkpointing else 2048}


def test_fit_recovers_the_factors_that_made_the_peaks(monkeypatch):
    truth = {(False, False): 0.9, (True, False): 0.6, (False, True): 2.5, (True, True): 1.4}
    monkeypatch.setattr(memory, "ACTIVATION_FACTOR", truth)
    rows = [{"inputs": (i := _inputs(m, c, ac)), "peak_gib": memory.estimate_from(i) / memory.GIB}
            for m in (1, 2, 3, 4) for c in (False, True) for ac in (False, True)]
    monkeypatch.undo()
    got = fit(rows)["ACTIVATION_FACTOR"]
    assert got == pytest.approx(truth, rel=1e-3)
