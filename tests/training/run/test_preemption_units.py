"""The preemption pieces that need no cluster: the keeper survives a failing GCS call, the
deadline the log reports is never optimistic, and a failed save in flight at a notice is passed
over for this step's checkpoint instead of failing the attempt (one gloo rank, inproc.py)."""

from __future__ import annotations

import time

import pytest
import ray

from tests.training.inproc import run_ranks
from training.pod_contract import RESTART_MARGIN_S
from training.run import preemption


def test_the_keeper_survives_a_failing_drain_call_and_moves_the_deadline(monkeypatch):
    deadline_ms = int((time.time() + 60) * 1000)
    monkeypatch.setattr(ray._private.state.state, "get_draining_nodes",
                        lambda: {"node-a": deadline_ms}, raising=False)
    calls = []

    def drain(nodes, deadline, why):
        calls.append((nodes, deadline))
        if len(calls) == 1:
            raise ConnectionError("GCS unavailable")  # one hiccup

    monkeypatch.setattr(preemption, "drain", drain)
    keeper = preemption.Keeper("node-a", poll_s=0.01)
    keeper.start()
    keeper.join(timeout=30)
    assert not keeper.is_alive() and len(calls) == 2
    assert calls[1] == (("node-a",), deadline_ms / 1000 - RESTART_MARGIN_S)


def test_the_seconds_left_count_the_keepers_margin_off_a_far_deadline():
    far = preemption.Notice(("n",), time.time() + 60).left_s()
    assert far == pytest.approx(60 - RESTART_MARGIN_S, abs=1)
    near = preemption.Notice(("n",), time.time() + 5).left_s()  # too close to be moved
    assert near == pytest.approx(5, abs=1)


class _FailedUpload:
    complete, error = False, OSError("bucket unreachable")

    def join(self) -> None:
        pass


def _save_now_after_a_failed_upload() -> list:
    from training.run import checkpoint

    saved = []
    checkpoint.save_and_report = lambda engine, state, metrics: saved.append(state)
    saver = checkpoint.Saver(asynchronous=False)
    saver._pending = (_FailedUpload(), "runs/x/checkpoint-step0000004", {})
    saver.save_now(None, checkpoint.RunState(step=6), {})
    return saved


def test_a_failed_upload_in_flight_at_a_notice_gives_way_to_this_steps_checkpoint():
    assert [s.step for s in run_ranks(1, _save_now_after_a_failed_upload)[0]] == [6]
