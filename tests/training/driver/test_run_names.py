"""A run given no --name is named from what defines it (training/run_names.py, the key a stack's
RayJob run carries too): another dataset, model, sequence length, LoRA or objective is a run of
its own, while more steps or another learning rate resume the same one; `make demo` stays
`demo`; --name overrides."""

from __future__ import annotations

import json

import pytest

from training.driver import cli, plan as run_plan, run_record
from training.run.checkpoint import MARKER, dir_name


def _name(*flags: str) -> str:
    return cli.parse(["--local", *flags]).name


def test_a_local_run_is_named_from_its_model_data_and_length_and_nothing_else():
    base = _name("--data", "a.jsonl", "--tokenizer", "bytes")
    assert base.startswith("tiny-")
    others = {_name("--data", "b.jsonl", "--tokenizer", "bytes"),
              _name("--data", "a.jsonl", "--tokenizer", "bytes", "--seq-len", "64"),
              _name("--data", "a.jsonl", "--tokenizer", "bytes", "--model", "qwen2.5-1.5b"),
              _name("--data", "a.jsonl", "--tokenizer", "bytes", "--lora-rank", "8"),
              _name("--data", "a.jsonl", "--tokenizer", "bytes", "--objective", "dpo")}
    assert base not in others and len(others) == 5
    # What an attempt may change resumes the same run.
    assert _name("--data", "a.jsonl", "--tokenizer", "bytes", "--steps", "70", "--lr",
                 "1e-4") == base
    assert _name("--data", "a.jsonl", "--tokenizer", "bytes", "--name", "mine") == "mine"


def test_the_demo_is_demo_and_a_lora_or_dpo_demo_a_run_of_its_own():
    assert cli.parse(["--demo"]).name == "demo"  # outputs/demo/, as the README says
    assert cli.parse(["--demo", "--steps", "70", "--lora-dropout", "0"]).name == "demo"
    lora = cli.parse(["--demo", "--lora-rank", "8"]).name
    dpo = cli.parse(["--demo", "--objective", "dpo"]).name
    assert lora.startswith("demo-") and dpo.startswith("demo-") and lora != dpo
    assert cli.parse(["--demo", "--lora-rank", "8", "--name", "demo"]).name == "demo"


def test_a_stack_run_keys_lora_and_dpo_apart_from_its_full_fine_tune():
    from tests.stack.stacks import STACK_FILES, raw_config
    from tests.workloads.test_manifests import stack
    from workloads.rayjob import run_name

    raw, _ = raw_config(STACK_FILES[0])
    training = json.loads(raw.get("training") or "{}")
    full = stack()
    dpo = stack(training=json.dumps({**training, "objective": "dpo"}))
    assert dpo.training.objective == "dpo"
    assert run_name(dpo) != run_name(full)
    assert run_name(full).rsplit("-", 1)[1] == cli.parse(
        ["--model", full.training.model, "--data", full.training.data, "--seq-len",
         str(full.training.seq_len)]).name.rsplit("-", 1)[1]  # one key, locally and on a stack


def test_a_second_dataset_is_a_new_run_not_a_refusal(tmp_path, no_ray):
    """Before, every local run was `qwen-fsdp`: a second dataset met the first's checkpoint and
    was refused."""
    from training.data.synthetic import SHIPPED

    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"text": f"row {i} of another set"}) + "\n"
                             for i in range(40)))
    flags = ["--local", "--storage-path", str(tmp_path / "runs"), "--tokenizer", "bytes",
             "--seq-len", "64"]
    first = cli.parse([*flags, "--data", str(SHIPPED)])
    run_record.record(first, run_plan.build(first)[1])  # as the driver does before Ray Train
    saved = tmp_path / "runs" / first.name / dir_name(10)
    saved.mkdir(parents=True)
    (saved / MARKER).write_text("")
    second = cli.parse([*flags, "--data", str(other)])
    plan, _ = run_plan.build(second)  # no refusal: a run of its own
    assert second.name != first.name and plan.resume is None
    with pytest.raises(ValueError, match=f"run {first.name!r} .* was trained with --data"):
        run_plan.build(cli.parse([*flags, "--data", str(other), "--name", first.name]))
