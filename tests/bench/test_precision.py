"""The precision and calibration benchmarks' pure parts and their refusals (their GPU runs are
`bash bench/device-run.sh trust`)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import calibrate, precision


def test_compare_measures_relative_error_and_cosine_over_all_tensors():
    ref = [torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])]  # norm 5
    same = precision.compare(ref, ref, torch.device("cpu"))
    assert same == {"rel_error": 0.0, "cosine": 1.0}
    # One tensor flipped: the difference has norm 2 x 4 = 8 of 5, the dot product 9 - 16.
    flipped = precision.compare([ref[0], -ref[1]], ref, torch.device("cpu"))
    assert flipped["rel_error"] == pytest.approx(8 / 5)
    assert flipped["cosine"] == pytest.approx(-7 / 25)


def test_too_little_text_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SystemExit, match="give --corpus a larger directory or fewer --steps"):
        precision.corpus_tokens(10**7, tmp_path)
    (tmp_path / "a.md").write_text("x" * 20_000)
    tokens, where = precision.corpus_tokens(20_000, tmp_path)
    assert len(tokens) == 20_000 and where["files"] == 2  # the shipped sample, then a.md


def test_bad_benchmark_flags_exit_2_before_anything_runs(tmp_path, capsys):
    assert precision.main(["--steps", "0"]) == 2
    assert calibrate.main(["--rows", "0,99"]) == 2
    empty = tmp_path / "bench.json"
    empty.write_text(json.dumps({"kind": "throughput", "rows": []}))
    assert calibrate.main(["--fit", str(empty)]) == 2
    assert "no measured calibration rows" in capsys.readouterr().err
