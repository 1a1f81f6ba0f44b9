"""The evaluation after the export: flags checked before anything runs, task names resolved as
lm_eval's CLI resolves them, the shipped task current, lm-eval's scores of a real model the same
as a standalone `lm_eval` run's, and a task that breaks at evaluation a reason, not a failure."""

from __future__ import annotations

import pytest
import torch

from training.config import ConfigError, TrainConfig
from training.evals import harness, shipped_task, tasks

TASK_DIR = str(shipped_task.TASK_DIR)


@pytest.mark.parametrize("settings, words", [
    ({"harness_tasks": TASK_DIR, "data": "x.jsonl"}, "add --export"),
    ({"harness_tasks": TASK_DIR, "export": True}, "need --data files"),
    ({"sample_prompts": 3, "export": True, "data": "x.jsonl"}, "--eval-fraction or --eval-data"),
    ({"harness_tasks": " , ", "export": True, "data": "x.jsonl"}, "at least one task"),
    ({"harness_limit": 0}, "--harness-limit"),
    ({"harness_fewshot": -1}, "--harness-fewshot"),
])
def test_wrong_harness_settings_are_refused_naming_the_fix(settings, words):
    assert any(words in p for p in TrainConfig(**settings).problems())


def test_harness_settings_that_fit_pass():
    assert TrainConfig(harness_tasks=TASK_DIR, export=True, data="x.jsonl", eval_fraction=0.05,
                       sample_prompts=3, harness_limit=20, harness_fewshot=0).problems() == []


def test_an_unknown_task_name_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="nosuch_task_xyz"):
        tasks.checked(TrainConfig(harness_tasks=f"{TASK_DIR},nosuch_task_xyz,{tmp_path}/no.yaml",
                                  export=True, data="x.jsonl"))


def test_a_task_folder_resolves_to_its_tasks_with_an_absolute_path(monkeypatch):
    monkeypatch.chdir(shipped_task.TASK_DIR.parent)
    cfg = tasks.checked(TrainConfig(harness_tasks="instructions_task", export=True,
                                    data="x.jsonl"))
    assert cfg.harness_tasks == TASK_DIR
    resolved, _ = tasks.resolve(cfg.harness_tasks)
    assert [t["task"] for t in resolved] == ["instructions_answers", "instructions_mc"]


def test_the_shipped_task_is_what_its_builder_writes():
    rows = shipped_task.build()
    assert shipped_task.DATA.read_text() == shipped_task.render(rows)
    assert len(rows) > 50 and all(len(r["choices"]) == 4 and
                                  r["choices"].count(r["choices"][r["label"]]) == 1 for r in rows)


@pytest.fixture(scope="module")
def tiny_hf_model(tmp_path_factory):
    """A pretrained-format model directory (random Qwen2 weights, the byte tokenizer)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from training.run.export import bytes_tokenizer

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=257, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True)
    d = tmp_path_factory.mktemp("hf")
    AutoModelForCausalLM.from_config(config).save_pretrained(d)
    bytes_tokenizer().save_pretrained(d)
    return str(d)


def test_scores_match_a_standalone_lm_eval_run_within_stderr(tiny_hf_model):
    from lm_eval import simple_evaluate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = TrainConfig(harness_tasks=TASK_DIR, harness_limit=20, export=True, data="x.jsonl")
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_model).eval()
    ours = harness.score(harness.ranked(model, AutoTokenizer.from_pretrained(tiny_hf_model)),
                         cfg)["instructions_mc"]
    resolved, manager = tasks.resolve(TASK_DIR)
    standalone = simple_evaluate(model="hf", model_args={"pretrained": tiny_hf_model},
                                 tasks=resolved, task_manager=manager, limit=20,
                                 device="cpu", batch_size=1)["results"]["instructions_mc"]
    for metric in ("acc,none", "acc_norm,none"):
        stderr = standalone[metric.replace(",", "_stderr,")]
        assert abs(ours[metric] - standalone[metric]) <= stderr


def test_side_by_side_pairs_each_score_with_its_own_models_stderr():
    base = {"t": {"alias": "t", "acc,none": 0.25, "acc_stderr,none": 0.1,
                  "exact_match,strict-match": 0.0, "exact_match_stderr,strict-match": "N/A"}}
    tuned = {"t": {"alias": "t", "acc,none": 0.5, "acc_stderr,none": 0.11,
                   "exact_match,strict-match": 0.2, "exact_match_stderr,strict-match": "N/A"}}
    assert harness.side_by_side(base, tuned) == {"t": {
        "acc": {"base": 0.25, "tuned": 0.5, "stderr": {"base": 0.1, "tuned": 0.11}},
        "exact_match,strict-match": {"base": 0.0, "tuned": 0.2,
                                     "stderr": {"base": None, "tuned": None}}}}


def test_a_task_that_breaks_at_evaluation_is_a_reason_not_a_failure(tiny_hf_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    broken = tmp_path / "broken.yaml"
    broken.write_text("task: broken_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                      f"    test: {tmp_path}/missing.jsonl\noutput_type: multiple_choice\n"
                      "test_split: test\ndoc_to_text: '{{question}}'\ndoc_to_choice: choices\n"
                      "doc_to_target: label\n")
    cfg = TrainConfig(harness_tasks=str(broken), export=True, data="x.jsonl")
    assert tasks.checked(cfg).harness_tasks == str(broken)  # passes the driver's check
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_model).eval()
    lm = harness.ranked(model, AutoTokenizer.from_pretrained(tiny_hf_model))
    result = harness.timed(lambda: harness.score(lm, cfg))
    assert result.scores is None and result.error and "missing.jsonl" in result.error
