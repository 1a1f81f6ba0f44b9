"""bench/RESULTS.md holds GPU measurements only, each row rendered from its JSON in bench/runs/."""

from __future__ import annotations

import json

from bench import results
from tests.conftest import REPO


def test_results_file_is_exactly_what_the_recorded_json_renders():
    # A hand-typed row, a row whose JSON is not in the repository, or a CPU rehearsal appended
    # by a benchmark run all make the file differ from its rendering.
    assert (REPO / "bench/RESULTS.md").read_text() == results.render(), (
        "bench/RESULTS.md is not what `python -m bench.results` renders from bench/runs/: "
        "run it (and put every result's JSON under bench/runs/<date>/)")


def test_every_row_names_a_gpu_result_json_in_the_repository():
    text = (REPO / "bench/RESULTS.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| 20")]
    assert rows, "no rows"
    for row in rows:
        name = row.rstrip(" |").rsplit("| ", 1)[1]
        result = json.loads((REPO / "bench" / name).read_text())
        assert result["env"]["date"] in row and results.on_gpu(result), row


def _bench_json(gpu: bool) -> dict:
    return {"settings": {"seq_len": 32, "micro_batch_size": 2, "memory_budget_gib": None,
                         "label": ""},
            "env": {"date": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA H200" if gpu else "cpu",
                    "world_size": 1, "torch": "2.11", "nccl": "2.28.9" if gpu else None,
                    "nccl_transport": "not-used", "command": "python -m bench"},
            "rows": [{"variant": "reference-no-sync", "tokens_per_s_per_gpu": 1000.0,
                      "step_time_ms": 10.0, "peak_mem_gib": 1.0}]}


def test_cpu_rehearsals_are_left_out_and_each_kind_has_its_section(tmp_path):
    runs = tmp_path / "runs" / "2026-12-01"
    runs.mkdir(parents=True)
    (runs / "cpu.json").write_text(json.dumps(_bench_json(gpu=False)))
    text = results.render(tmp_path / "runs")
    assert "reference-no-sync" not in text and text.count("No measurement recorded yet") == 4
    (runs / "gpu.json").write_text(json.dumps(_bench_json(gpu=True)))
    text = results.render(tmp_path / "runs")
    assert "| reference-no-sync |" in text and "| runs/2026-12-01/gpu.json |" in text
    assert text.count("No measurement recorded yet") == 3
