"""A rerun under the same --name with other defining settings (a LoRA rank on a full fine-tune,
another dataset) is one error line naming what differs, before the data is tokenized or Ray
starts; other settings (more steps) go on."""

from __future__ import annotations

from training.config import TrainConfig
from training.driver import cli, run_record
from training.run.checkpoint import MARKER, dir_name
from training.storage import resolve


def _saved_run(tmp_path, *flags: str) -> TrainConfig:
    """A run with a complete checkpoint at step 10, recorded as the driver records it."""
    cfg = cli.parse(["--demo", "--storage-path", str(tmp_path / "runs"), *flags])
    storage = resolve(cfg.storage_path)
    run_record.check(cfg, storage)
    run_record.record(cfg, storage)
    ckpt = tmp_path / "runs" / cfg.name / dir_name(10)
    ckpt.mkdir(parents=True)
    (ckpt / MARKER).write_text("")
    return cfg


def test_a_lora_rank_on_a_finished_full_fine_tune_is_one_line_before_ray(tmp_path, capsys):
    _saved_run(tmp_path)  # (without --name, the LoRA demo is a run of its own: test_run_names)
    code = cli.main(["--demo", "--lora-rank", "8", "--name", "demo", "--storage-path",
                     str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_BAD_INPUT
    assert len(err) == 1
    assert "run 'demo'" in err[0] and "was trained with --lora-rank 0, this run asks " \
        "--lora-rank 8" in err[0]
    assert "--name demo-lora-rank-8" in err[0]


def test_other_data_is_named_in_words_and_more_steps_are_not_a_difference(tmp_path):
    cfg = _saved_run(tmp_path)
    storage = resolve(cfg.storage_path)
    run_record.check(TrainConfig(**{**cfg.to_dict(), "steps": 70}), storage)
    other = TrainConfig(**{**cfg.to_dict(), "data": "/data/other.jsonl"})
    try:
        run_record.check(other, storage)
    except run_record.OtherRunError as e:
        assert f'--data "{cfg.data}", this run asks --data "/data/other.jsonl"' in str(e)
        assert "--name demo-data-other.jsonl" in str(e)
    else:
        raise AssertionError("another --data resumed the run")


def test_a_run_without_a_checkpoint_starts_over_under_new_settings(tmp_path):
    cfg = cli.parse(["--demo", "--storage-path", str(tmp_path / "runs")])
    storage = resolve(cfg.storage_path)
    run_record.record(cfg, storage)
    lora = TrainConfig(**{**cfg.to_dict(), "lora_rank": 8})
    run_record.check(lora, storage)  # nothing saved yet: no refusal
    run_record.record(lora, storage)
    assert '"lora_rank": 8' in (tmp_path / "runs/demo/run.json").read_text()



def test_another_held_out_fraction_is_named_not_two_data_hashes(tmp_path):
    """It picks which documents train: the saved data position means nothing under another."""
    cfg = _saved_run(tmp_path)
    other = TrainConfig(**{**cfg.to_dict(), "eval_fraction": 0.2})
    try:
        run_record.check(other, resolve(cfg.storage_path))
    except run_record.OtherRunError as e:
        assert "--eval-fraction 0.05, this run asks --eval-fraction 0.2" in str(e)
    else:
        raise AssertionError("another --eval-fraction resumed the run")
