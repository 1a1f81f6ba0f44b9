"""harness.png: the base and the tuned model's bars for every metric both have, written next to
metrics.png only when there are scores."""

from __future__ import annotations

import pyarrow.fs as pafs

from training.evals import after_export, plot
from training.run.run_files import RunFiles

HARNESS = {
    "instructions_mc": {"acc": {"base": 0.25, "tuned": 0.6, "stderr": {"base": 0.1, "tuned": 0.11}},
                        "acc_norm": {"base": 0.3, "tuned": 0.55,
                                     "stderr": {"base": 0.1, "tuned": None}}},
    "gsm8k": {"exact_match,strict-match": {"base": 0.1, "tuned": 0.2,
                                           "stderr": {"base": 0.03, "tuned": 0.04}},
              "exact_match,flexible-extract": {"base": None, "tuned": 0.3,
                                               "stderr": {"base": None, "tuned": 0.05}}},
}


def test_the_plot_holds_both_models_bars_for_each_metric_they_both_have(tmp_path):
    png = tmp_path / plot.PLOT_FILE
    drawn = plot.plot_harness(HARNESS, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert drawn == {"labels": ["instructions_mc acc", "instructions_mc acc_norm",
                                "gsm8k exact_match,strict-match"],
                     "base": [0.25, 0.3, 0.1], "tuned": [0.6, 0.55, 0.2]}


def test_no_scores_no_plot(tmp_path):
    png = tmp_path / plot.PLOT_FILE
    assert plot.plot_harness({}, png) is None
    assert plot.plot_harness({"t": {"acc": {"base": None, "tuned": 0.5,
                                            "stderr": {"base": None, "tuned": None}}}}, png) is None
    assert not png.exists()


def test_the_plot_lands_next_to_metrics_png_in_the_run_directory(tmp_path):
    files = RunFiles(pafs.LocalFileSystem(), str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    after_export._write_plot(files, HARNESS)
    assert files.read_bytes(plot.PLOT_FILE)[:4] == b"\x89PNG"
