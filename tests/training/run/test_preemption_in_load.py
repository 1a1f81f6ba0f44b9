"""A preemption while the model loads, before anything is saved, on the local cluster of
test_preemption.py: the node's `ray start --block` gets SIGTERM (a KubeRay pod's eviction) while
every worker is held as its load begins (--hold-at-step 0, training/run/hooks.py). The node's
keeper runs from the first line of the attempt (training/run/preemption.py `keep_node`), so Ray
Train restarts the workers as a preemption, on its own budget: with --max-failures 0 the run
still finishes, from scratch, on the replacement node."""

from __future__ import annotations

import signal

from tests.training.run.test_preemption import cluster, finish, wait_for  # noqa: F401 (fixture)


def test_a_preemption_while_the_model_loads_resumes_without_touching_max_failures(cluster,
                                                                                 tmp_path):
    storage = tmp_path / "runs"
    node = cluster.procs[-1]  # the one worker node: the run's two workers go there
    job = cluster.job(storage, "loading", "--hold-at-step", "0", "--steps", "2")
    wait_for(storage / "loading/test-hooks/held-at-step-0", job)  # Ray starts first
    cluster.add_node()  # the replacement
    node.send_signal(signal.SIGTERM)  # drains for RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, then kills
    s, out = finish(job)  # --max-failures 0 (test_preemption.JOB): a failure would end the run
    assert s["steps"] == 2 and s["resumed_from_step"] is None, s  # nothing was saved to resume
    assert node.poll() is not None  # the held attempt's node is gone
    assert "--hold-at-step 0: no preemption came" not in out
