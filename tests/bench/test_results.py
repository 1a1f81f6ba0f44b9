"""bench/RESULTS.md holds GPU measurements (and, for the kinds in CPU_SHOWN, CPU ones marked as
such), each row rendered from its JSON in bench/runs/."""

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
        assert result["env"]["date"] in row, row
        assert results.on_gpu(result), row  # CPU measurements stay in their JSON and docs


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
    empty = len(results.SECTIONS)  # every kind's section, each empty
    assert "reference-no-sync" not in text and text.count("No measurement recorded yet") == empty
    (runs / "gpu.json").write_text(json.dumps(_bench_json(gpu=True)))
    text = results.render(tmp_path / "runs")
    assert "| reference-no-sync |" in text and "| runs/2026-12-01/gpu.json |" in text
    assert text.count("No measurement recorded yet") == empty - 1


def test_lora_rows_show_plan_peak_against_estimate_loss_and_refusals(tmp_path):
    """A LoRA result as bench/lora.py writes it (CPU rehearsal's shape, a GPU's provenance)."""
    inputs = {"model": "tiny", "vocab_size": 512, "num_params": 144192, "shard_size": 1,
              "world": 1, "compiled": True, "micro_batch": 8, "seq_len": 64, "grad_accum": 1,
              "reduce_dtype": "fp32", "accum_dtype": "fp32", "checkpointing": False,
              "zero2": False, "loss_chunk_tokens": 2048, "trainable_params": 18688,
              "lora_dropout": False}
    base = {"model": "tiny", "memory_budget_gib": 22.0, "seq_len": 64, "tokens_per_step": 512}
    ran = {**base, "run": "lora", "lora_rank": 16, "trainable_params": 18688, "inputs": inputs,
           "plan": {"micro_batch_size": 8, "grad_accum": 1, "activation_checkpointing": False},
           "tokens_per_s": 1234.5, "peak_gib": 1.0, "estimated_peak_gib": 0.9,
           "estimate_error": -0.1, "first_loss": 6.2, "last_loss": 5.1,
           "grad_norms_finite": True}
    refused = {**base, "run": "full-budget", "lora_rank": 0,
               "error_text": "ConfigError: micro-batch 1 needs about 30 GiB"}
    result = {"kind": "lora", "rows": [ran, refused], "settings": {},
              "env": {**_bench_json(gpu=True)["env"], "command": "python -m bench.lora"}}
    runs = tmp_path / "runs" / "2026-12-01"
    runs.mkdir(parents=True)
    (runs / "lora.json").write_text(json.dumps(result))
    rendered = results.render(tmp_path / "runs").splitlines()
    lines = [r for r in rendered if "`python -m bench.lora` |" in r]
    assert len(lines) == 2 and all(r.count("|") == lines[0].count("|") for r in lines)
    assert "| lora | tiny | 16 | 22 | 8 x 64 | 8 x 1 | 0.0M | 1,234 | 1.00 | 0.90 |" in lines[0]
    assert "| -10.0% |" in lines[0] and "| 6.200 -> 5.100 |" in lines[0]
    assert "| full-budget | tiny | - | 22 | 8 x 64 | error: ConfigError: micro-batch 1" in lines[1]


def _rendered(tmp_path, kind: str, rows: list[dict]) -> list[str]:
    """RESULTS.md's lines for one GPU result of `kind` (`python -m bench.<kind>`) holding `rows`."""
    env = {**_bench_json(gpu=True)["env"], "command": f"python -m bench.{kind}"}
    runs = tmp_path / "runs" / "2026-12-02"
    runs.mkdir(parents=True)
    (runs / f"{kind}.json").write_text(json.dumps({"kind": kind, "rows": rows, "env": env,
                                                   "settings": {}}))
    return results.render(tmp_path / "runs").splitlines()


def test_lora_rows_name_the_attention_and_a_baseline_that_attends_across_documents(tmp_path):
    """Ours on flex_attention says so (sdpa, the laptop's, goes unsaid); the baseline says when
    its rows were causal: with the key's old absence, as it ran before it took positions."""
    row = {"model": "tiny", "memory_budget_gib": None, "seq_len": 64, "tokens_per_step": 512,
           "lora_rank": 16, "trainable_params": 18688, "tokens_per_s": 1.0, "peak_gib": 1.0,
           "first_loss": 6.2, "last_loss": 5.1, "losses_finite": True}
    naive = {"micro_batch_size": 2, "grad_accum": 4, "naive": "peft"}
    rows = [{**row, "run": "naive-large", "plan": {**naive, "attention": "sdpa, per document"}},
            {**row, "run": "naive-large", "plan": {**naive, "attention": "sdpa, causal rows"}},
            {**row, "run": "naive-large", "plan": naive}]
    rendered = [r for r in _rendered(tmp_path, "lora", rows) if "naive PEFT" in r]
    assert ["causal rows" in r for r in rendered] == [False, True, True]
    ours = {"run": "lora-large", "plan": {"activation_checkpointing": True}}
    assert results._attention({**ours, "attention": "flex_attention"}, {}) == "flex_attention"
    assert results._attention(ours, {"settings": {"attention": None}}) == "flex_attention"
    assert results._attention(ours, {"settings": {}}) == "sdpa"


def test_a_packed_dpo_rows_estimate_is_restated_for_the_pair_row_once(tmp_path):
    """A packed row's planner planned rows of 2 x --seq-len. The first packed runs recorded
    --seq-len in the estimate's inputs, so the rendering restates their estimate for the pair
    row; later runs record the pair row itself, which must not be doubled again."""
    from training.step.memory import estimate_from

    inputs = {"model": "tiny", "vocab_size": 512, "num_params": 144192, "shard_size": 1,
              "world": 1, "compiled": True, "micro_batch": 2, "grad_accum": 1,
              "reduce_dtype": "fp32", "accum_dtype": "fp32", "checkpointing": False,
              "zero2": False, "loss_chunk_tokens": 2048, "trainable_params": None,
              "lora_dropout": False}
    pair_row = estimate_from({**inputs, "seq_len": 128}) / 2**30
    row = {"run": "full", "model": "tiny", "memory_budget_gib": None, "seq_len": 64,
           "tokens_per_step": 512, "lora_rank": 0, "trainable_params": 144192,
           "plan": {"micro_batch_size": 2, "grad_accum": 1, "activation_checkpointing": False},
           "tokens_per_s": 100.0,
           "peak_gib": pair_row, "first_loss": 0.69, "last_loss": 0.6, "grad_norms_finite": True,
           "pairs_per_row": 2,
           "pair_tokens_per_s": 90.0}
    rows = [{**row, "inputs": {**inputs, "seq_len": seq}, "estimated_peak_gib": pair_row,
             "estimate_error": 0.0} for seq in (64, 128)]  # the first runs' record, later ones'
    lines = [r for r in _rendered(tmp_path, "dpo", rows) if "bench.dpo` |" in r]
    assert len(lines) == 2 and all("| +0.0% | +0.0% |" in line for line in lines), lines


def _poll_json(gpu: bool) -> dict:
    """A result as bench/preemption_poll.py writes it."""
    env = {**_bench_json(gpu)["env"], "world_size": 2, "command": "python -m bench.preemption_poll"}
    calls = [{"measured": m, "backend": "gloo", "workers": 2, "calls": 300, "median_ms": ms,
              "p95_ms": 2 * ms} for m, ms in (("get_preemption_info", 1.5),
                                              ("dist.barrier", 0.25))]
    runs = [{"pair": 0, "polls": polls, "steps": 40} for polls in (True, False)]
    pairs = [{"pair": 0, "with_ms": 52.0, "without_ms": 50.0, "difference_ms": 2.0,
              "share": 0.04, "loadavg_1m": [3.25, 2.5]}]
    return {"kind": "preemption-poll", "env": env, "settings": {}, "calls": calls,
            "runs": runs, "pairs": pairs}


def test_the_preemption_check_shows_its_gpu_rows_and_no_cpu_ones(tmp_path):
    runs = tmp_path / "runs" / "2026-12-02"
    runs.mkdir(parents=True)
    (runs / "poll-cpu.json").write_text(json.dumps(_poll_json(gpu=False)))
    (runs / "bench-cpu.json").write_text(json.dumps(_bench_json(gpu=False)))
    text = results.render(tmp_path / "runs")
    assert "poll-cpu.json" not in text and "bench-cpu.json" not in text and "| CPU" not in text
    (runs / "poll-gpu.json").write_text(json.dumps(_poll_json(gpu=True)))
    text = results.render(tmp_path / "runs")
    rows = [r for r in text.splitlines() if r.endswith("| runs/2026-12-02/poll-gpu.json |")]
    assert len(rows) == 3 and all("| NVIDIA H200 x2 |" in r for r in rows)
    assert "| get_preemption_info | 300 | 1.500 | 3.000 |" in rows[0]
    assert "| job step, pair 1 | 40 steps |  |  | 52.0 | 50.0 | +2.0 (+4.0%) | 3.2 / 2.5 |" \
        in rows[2]
    assert "poll-cpu.json" not in text
