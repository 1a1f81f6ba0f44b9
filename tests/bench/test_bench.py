"""CPU smoke test of the benchmark, so it cannot rot: 2 tiny steps through Ray Train."""

from __future__ import annotations

import gzip
import json

import pytest

from bench import benchmark as bench
from bench import results
from tests.conftest import REPO
from training.network.device_time import kernel_breakdown

pytestmark = pytest.mark.usefixtures("ray_session")


def test_bench_runs_ours_and_writes_json_and_a_results_row(tmp_path):
    out = tmp_path / "result.json"
    rc = bench.main(["--model", "tiny", "--seq-len", "32", "--micro-batch-size", "2",
                     "--grad-accum", "2", "--steps", "2", "--warmup", "1",
                     "--variants", "reference,ours,ours-hsdp", "--json-out", str(out),
                     "--work-dir", str(tmp_path / "work"),
                     "--profile-dir", str(tmp_path / "prof")])
    assert rc == 0
    result = json.loads(out.read_text())
    rows = {r["variant"]: r for r in result["rows"]}
    assert "needs a GPU" in rows["reference"]["error"]  # FSDP1 is GPU-only: skipped, said so
    ours, hsdp = rows["ours"], rows["ours-hsdp"]
    assert ours["tokens_per_s_per_gpu"] > 0 and ours["mfu"] is None
    assert ours["tokens_per_step"] == 2 * 2 * 2 * 32  # workers x micro-batch x accumulation x seq
    # The step-time model's inputs: compute without communication, and each group's bandwidth.
    assert ours["compute_ms_per_micro_batch"] > 0
    assert ours["bandwidth"]["allgather_busbw_gbps"] > 0
    assert ours["bandwidth"]["allreduce_busbw_gbps"] is None
    assert hsdp["mesh"] == "2x1" and hsdp["bandwidth"]["allreduce_busbw_gbps"] > 0
    assert result["env"]["world_size"] == 2 and result["env"]["nccl_transport"] == "not-used"
    trace = json.loads(gzip.decompress((tmp_path / "prof" / "ours.trace.json.gz").read_bytes()))
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    assert ours["profile"]["trace"] == "ours.trace.json.gz"
    cells = [results.throughput_rows(result, "x.json")[i][3] for i in range(3)]
    assert cells[1] == "ours (eager, ZeRO-3, mesh 1x2, fp32 reduce, x2 accumulation)"
    assert not (REPO / "bench/RESULTS.md").read_text().count("cpu x2")  # never appended


def test_unknown_variant_is_refused():
    assert bench.main(["--variants", "ours,turbo"]) == 2


def test_kernel_breakdown_splits_device_time_and_finds_exposed_communication_and_idle():
    # Two steps; times in microseconds. Step 1: matmul 0-1000, NCCL 500-1500 (half hidden behind
    # the matmul), then the GPU idles 1500-2000; step 2: attention 2000-2600, softmax 2600-3000.
    kernels = [("sm90_xmma_gemm_bf16", 0, 1000), ("ncclDevKernel_AllGather_RING_LL", 500, 1500),
               ("flash_fwd_kernel", 2000, 2600), ("softmax_warp_forward", 2600, 3000)]
    ms = kernel_breakdown(kernels, steps=2)
    assert ms == {"attention": 0.3, "communication": 0.5, "exposed_communication": 0.25,
                  "idle": 0.25, "matmul": 0.5, "other": 0.2, "window": 1.5}
    assert kernel_breakdown([], steps=2) == {}
