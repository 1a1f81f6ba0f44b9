"""The learning-rate schedule: fresh runs, and reruns with more steps (saved schedule extended)."""

from __future__ import annotations

import pytest

from training.run import checkpoint
from training.config import TrainConfig
from training.run.checkpoint import start_state
from training.step.schedule import Schedule, resume_schedule


def test_schedule_warms_up_then_decays_to_a_tenth():
    s = Schedule(peak=1e-3, warmup=10, total=100)
    assert s.lr(1) == pytest.approx(1e-4) and s.lr(10) == pytest.approx(1e-3)
    assert s.lr(100) == pytest.approx(1e-4)
    assert all(s.lr(i) >= s.lr(i + 1) for i in range(10, 100))


@pytest.mark.parametrize("stopped_at", [10, 6])
def test_rerun_with_more_steps_continues_the_learning_rate_without_a_jump(stopped_at):
    # The case: 10 steps, then a rerun to 14 (the old schedule gave 1.0e-4 at step 10 and
    # 3.25e-4 at step 11); and a run stopped half-way through its decay.
    old = Schedule(peak=1e-3, warmup=2, total=10)
    new = old.extended(14, at_step=stopped_at)
    assert new.lr(stopped_at) == pytest.approx(old.lr(stopped_at))
    assert all(new.lr(i) >= new.lr(i + 1) for i in range(stopped_at, 14))  # never re-warms
    assert new.lr(14) == pytest.approx(1e-4)
    assert new.lr(stopped_at + 1) <= old.lr(stopped_at) + 1e-12


def test_extension_inside_warmup_keeps_warming_up_to_the_same_peak():
    new = Schedule(peak=1e-3, warmup=5, total=10).extended(20, at_step=3)
    assert new == Schedule(peak=1e-3, warmup=5, total=20)
    assert new.extended(30, at_step=12).lr(12) == pytest.approx(new.lr(12))  # twice extended


def test_resume_keeps_the_saved_peak_and_warmup_and_says_so():
    saved = Schedule(peak=1e-3, warmup=2, total=10).to_dict()
    schedule, notes = resume_schedule(saved, peak=5e-3, warmup=0, total=10, at_step=4)
    assert schedule == Schedule(**saved)
    assert len(notes) == 1 and "keeping the saved ones" in notes[0]
    schedule, notes = resume_schedule(saved, peak=1e-3, warmup=2, total=14, at_step=10)
    assert schedule.total == 14 and "no re-warmup" in notes[0]


def test_start_state_of_a_fresh_run_and_of_a_resumed_one():
    cfg = TrainConfig(steps=14, lr=1e-3, warmup_steps=2)
    state, schedule, notes = start_state(cfg, None, "random")
    assert (state.step, state.samples_seen, notes) == (0, 0, [])
    assert schedule == Schedule(peak=1e-3, warmup=2, total=14)
    saved = checkpoint.RunState(step=10, samples_seen=80, first_loss=6.2, data="random",
                                schedule=Schedule(peak=1e-3, warmup=2, total=10).to_dict())
    state, schedule, notes = start_state(cfg, saved, "random")
    assert (state.step, state.samples_seen, state.first_loss) == (10, 80, 6.2)
    assert state.schedule == schedule.to_dict() and schedule.lr(11) == pytest.approx(1e-4)


def test_resuming_on_other_data_is_refused_with_the_fix():
    saved = checkpoint.RunState(step=4, data="abc", schedule=Schedule(1e-3, 0, 8).to_dict())
    with pytest.raises(checkpoint.CheckpointError,
                       match="train on the data it saw, or start a new run with another --name"):
        start_state(TrainConfig(steps=8), saved, "def")


@pytest.mark.parametrize("text", ['{"step": 4, "data_position": 8}', '{"step": 4}', "[4]", "{"])
def test_a_checkpoint_state_from_an_older_job_is_refused_with_what_to_do(text):
    from training.run.checkpoint import CheckpointError, RunState

    with pytest.raises(CheckpointError, match="older version of the job.*another --name"):
        RunState.from_json(text, "s3://b/runs/x/checkpoint-step0000004")


def test_extending_a_finished_decay_says_it_holds_the_floor_not_a_decay_to_the_same_value():
    """At its last step a run's lr is the floor already: "decay to 1.000e-04 from 1.000e-04" said
    nothing; the note says the lr holds there, and a run stopped mid-decay still hears of one."""
    saved = Schedule(peak=1e-3, warmup=2, total=10).to_dict()
    schedule, notes = resume_schedule(saved, peak=1e-3, warmup=2, total=20, at_step=10)
    assert schedule.lr(15) == pytest.approx(1e-4)
    assert "holding lr 1.000e-04 (the schedule's floor) to step 20" in notes[0]
    assert "decay" not in notes[0]
    _, notes = resume_schedule(saved, peak=1e-3, warmup=2, total=20, at_step=6)
    assert "cosine decay to 1.000e-04 at step 20" in notes[0]
