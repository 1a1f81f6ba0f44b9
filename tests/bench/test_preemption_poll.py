"""CPU rehearsal of the preemption-check benchmark (device-run.sh preempt-poll): the poll's cost
per call on 2 gloo workers, and how a pair of job runs becomes the per-step difference."""

from __future__ import annotations

import json

from bench import preemption_poll


def test_two_workers_time_the_poll_a_barrier_and_an_all_reduce(ray_session, tmp_path):
    out = tmp_path / "poll.json"
    assert preemption_poll.main(["--num-workers", "2", "--calls", "5", "--pairs", "0",
                                 "--storage-path", str(tmp_path / "runs"),
                                 "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "preemption-poll" and result["env"]["nccl"] is None
    calls = {c["measured"]: c for c in result["calls"]}
    assert set(calls) == set(preemption_poll.PROBES)
    for c in calls.values():
        assert c["backend"] == "gloo" and c["workers"] == 2 and c["calls"] == 5
        assert 0 < c["median_ms"] <= c["p95_ms"]
    assert result["runs"] == [] and result["pairs"] == []


def test_bad_flags_are_refused_before_ray(capsys):
    assert preemption_poll.main(["--pairs", "1", "--steps", "5"]) == 2
    assert "--steps 5" in capsys.readouterr().err
    assert preemption_poll.main(["--calls", "0"]) == 2


def test_p95_is_the_nearest_rank():
    ms = preemption_poll.percentiles_ms([i / 1000 for i in range(100, 0, -1)])
    assert abs(ms["p95_ms"] - 95) < 1e-9 and abs(ms["median_ms"] - 50.5) < 1e-9


def test_pairs_compare_each_run_with_polls_to_its_own_partner():
    def run(pair, polls, ms):
        return {"pair": pair, "polls": polls, "step_time_ms": ms, "loadavg_1m": [pair + polls / 2, 0.0]}

    runs = [run(0, True, 110.0), run(0, False, 100.0), run(1, True, 99.0), run(1, False, 100.0),
            run(2, True, 500.0)]  # the last pair was cut short: no partner, no row
    p0, p1 = preemption_poll.pair_rows(runs)
    assert (p0["difference_ms"], p1["difference_ms"]) == (10.0, -1.0)
    assert abs(p0["share"] - 0.1) < 1e-12 and p1["loadavg_1m"] == [1.5, 1.0]
