"""The NCCL transport classifier, its CLI contract, and the job-side decision."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import NCCL_FIXTURES, REPO, SHARED_NCCL, need
from training.network import nccl
from training.network.transport import TransportError, decide


def facts_of(*paths) -> nccl.Facts:
    facts = nccl.Facts()
    for p in paths:
        facts = facts.merge(nccl.parse(p.read_text().splitlines()))
    return facts


def test_single_node_p2p_is_not_a_fallback_although_it_says_using_network_socket():
    log = need(SHARED_NCCL / "h200-1node-2gpu-p2p.rank0.log")
    assert "Using network Socket" in log.read_text()
    r = nccl.report(facts_of(log))
    assert r["verdict"] == "single-node" and r["nodes"] == 1 and r["inter_node_transports"] == []


def test_sockets_between_ranks_are_a_fallback():
    r = nccl.report(facts_of(need(SHARED_NCCL / "h200-2gpu-p2p-shm-disabled-socket.rank0.log")))
    assert r["verdict"] == "socket-fallback" and r["nodes"] == 2
    assert any("via NET/Socket/0" in e for e in r["evidence"])


def test_multi_node_efa_new_format_without_gdrdma_is_efa():
    r = nccl.report(facts_of(NCCL_FIXTURES / "efa-2node-ofi-1.20.rank0.log"))
    assert r == {**r, "verdict": "efa", "nodes": 2, "plugin": "aws-ofi-nccl 1.20.0",
                 "inter_node_transports": ["NET/Libfabric"]}


def test_older_plugin_format_aws_libfabric_is_efa():
    r = nccl.report(facts_of(NCCL_FIXTURES / "efa-2node-ofi-old.rank4.log"))
    assert r["verdict"] == "efa" and r["inter_node_transports"] == ["NET/Libfabric"]
    assert r["plugin"] == "AWS Libfabric"


def test_plugin_failure_then_sockets_is_a_fallback_blamed_on_the_plugin():
    facts = facts_of(NCCL_FIXTURES / "efa-plugin-failed-socket.rank0.log")
    assert nccl.verdict(facts) == "socket-fallback" and facts.plugin_failed
    assert "aws-ofi-nccl plugin failed" in nccl.explain("socket-fallback", facts)


def test_one_fallback_rank_among_healthy_ranks_makes_the_job_a_fallback():
    facts = facts_of(NCCL_FIXTURES / "efa-2node-ofi-1.20.rank0.log",
                     NCCL_FIXTURES / "efa-plugin-failed-socket.rank0.log")
    assert nccl.verdict(facts) == "socket-fallback"
    assert facts.transports == {"NET/Libfabric", "NET/Socket"}


def test_several_communicators_in_one_file_are_all_read(tmp_path):
    # Second communicator is multi-node and lazily connected: no channel lines, network Socket.
    log = tmp_path / "two-comms.log"
    log.write_text(
        "h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n"
        "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
        "h:1:1 [0] NCCL INFO Using network Socket\n"
        "h:1:1 [0] NCCL INFO comm 0x2 rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0\n")
    assert nccl.verdict(nccl.parse(log.read_text().splitlines())) == "socket-fallback"


def test_ib_and_unknown_verdicts():
    ib = ["x NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0",
          "x NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA"]
    assert nccl.verdict(nccl.parse(ib)) == "ib"
    assert nccl.verdict(nccl.parse(["x NCCL INFO NCCL version 2.29.7"])) == "unknown"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "training.network.nccl", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True)


def test_cli_exit_codes_follow_expect(tmp_path):
    efa = NCCL_FIXTURES / "efa-2node-ofi-1.20.rank0.log"
    socket = NCCL_FIXTURES / "efa-plugin-failed-socket.rank0.log"
    ok = run_cli(efa, "--expect", "efa")
    assert ok.returncode == 0 and json.loads(ok.stdout)["verdict"] == "efa"
    bad = run_cli(socket, "--expect", "efa")
    assert bad.returncode == 3 and json.loads(bad.stdout)["verdict"] == "socket-fallback"
    assert run_cli(socket).returncode == 0  # --expect any
    empty = tmp_path / "empty.log"
    empty.write_text("no nccl here\n")
    assert run_cli(empty).returncode == 2
    missing = run_cli(tmp_path / "missing.log")
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_job_guard_raises_on_fallback_and_passes_healthy():
    socket = facts_of(NCCL_FIXTURES / "efa-plugin-failed-socket.rank0.log")
    with pytest.raises(TransportError, match="vpc.amazonaws.com/efa"):
        decide(socket, expect="any", on_fallback="fail")
    warned = decide(socket, expect="any", on_fallback="warn")
    assert warned.verdict == "socket-fallback" and warned.message
    healthy = decide(facts_of(NCCL_FIXTURES / "efa-2node-ofi-1.20.rank0.log"), "efa", "fail")
    assert healthy.verdict == "efa" and healthy.message is None


def test_expecting_efa_on_one_node_is_flagged():
    single = facts_of(need(SHARED_NCCL / "h200-1node-2gpu-p2p.rank0.log"))
    assert decide(single, expect="any", on_fallback="fail").message is None
    with pytest.raises(TransportError, match="one node"):
        decide(single, expect="efa", on_fallback="fail")


def test_logs_captured_by_the_job_on_h200_classify_as_the_runs_were():
    healthy = facts_of(*sorted(NCCL_FIXTURES.glob("h200-job-healthy.rank*.log")))
    sockets = facts_of(*sorted(NCCL_FIXTURES.glob("h200-job-sockets.rank*.log")))
    assert nccl.verdict(healthy) == "single-node"
    assert nccl.verdict(sockets) == "socket-fallback"
    with pytest.raises(TransportError):
        decide(sockets, expect="any", on_fallback="fail")
