"""CPU smoke test of the benchmark, so it cannot rot: 2 tiny steps through Ray Train."""

from __future__ import annotations

import json

import pytest

from training import bench

pytestmark = pytest.mark.usefixtures("ray_session")


def test_bench_runs_ours_and_writes_json_and_a_results_row(tmp_path):
    out, md = tmp_path / "result.json", tmp_path / "RESULTS.md"
    rc = bench.main(["--model", "tiny", "--seq-len", "32", "--micro-batch-size", "2", "--steps", "2",
                     "--warmup", "1", "--variants", "reference,ours", "--json-out", str(out),
                     "--results-md", str(md), "--work-dir", str(tmp_path / "work")])
    assert rc == 0
    result = json.loads(out.read_text())
    rows = {r["variant"]: r for r in result["rows"]}
    assert "needs a GPU" in rows["reference"]["error"]  # FSDP1 is GPU-only: skipped, said so
    assert rows["ours"]["tokens_per_s_per_gpu"] > 0 and rows["ours"]["mfu"] is None
    assert result["env"]["world_size"] == 2 and result["env"]["nccl_transport"] == "not-used"
    table = md.read_text()
    assert table.count("\n| ") == 3 and "| ours |" in table  # header + 2 rows


def test_unknown_variant_is_refused():
    assert bench.main(["--variants", "ours,turbo"]) == 2
