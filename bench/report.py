"""How a step-benchmark result reads: the console table `python -m bench` prints, and the variant
cell (the variant with what its settings resolved to) that bench/RESULTS.md shows too."""

from __future__ import annotations


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(result: dict) -> str:
    env, s = result["env"], result["settings"]
    lines = [f"{env['gpu']} x{env['world_size']}, torch {env['torch']}, NCCL {env['nccl']}, "
             f"matmul {fmt(env['matmul_tflops'], '.0f')} TFLOP/s, seq {s['seq_len']}, "
             f"micro-batch {s['micro_batch_size']} x {s.get('grad_accum', 1)} accumulated, "
             f"NCCL transport {env['nccl_transport']}",
             f"{'variant':<28} {'tok/s/GPU':>10} {'MFU':>6} {'MFU mm':>6} {'step ms':>8} "
             f"{'peak GiB':>9} {'vs ref':>7}   (MFU: datasheet peak; MFU mm: measured matmul)"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"{r['variant']:<28} {r['error']}")
            continue
        lines.append(f"{r['variant']:<28} {r['tokens_per_s_per_gpu']:>10,.0f} "
                     f"{fmt(r.get('mfu'), '.3f'):>6} {fmt(r.get('mfu_measured_matmul'), '.3f'):>6} "
                     f"{r['step_time_ms']:>8.1f} "
                     f"{fmt(r['peak_mem_gib'], '.1f'):>9} {fmt(r.get('vs_reference'), '.2f'):>7}")
        bw = r.get("bandwidth") or {}
        if bw or "compute_ms_per_micro_batch" in r:
            lines.append(f"    compute {fmt(r.get('compute_ms_per_micro_batch'), '.1f')} ms per "
                         f"micro-batch without communication; bus GB/s: all-gather "
                         f"{fmt(bw.get('allgather_busbw_gbps'), '.2f')}, all-reduce "
                         f"{fmt(bw.get('allreduce_busbw_gbps'), '.2f')}")
        if r.get("profile") and r["profile"]["ms_per_step"]:
            lines.append("    device ms/step: " + ", ".join(
                f"{k} {v:g}" for k, v in r["profile"]["ms_per_step"].items()))
    return "\n".join(lines)


def variant_cell(row: dict) -> str:
    """The variant with what its settings resolved to, e.g. `ours (compiled, ZeRO-2)`: `ours` means
    the job's defaults, which change over time (the oldest rows carry no plan; later ones a plan
    without mesh, reduce dtype or accumulation)."""
    if "compile" not in row:
        return row["variant"]
    plan = ["compiled" if row["compile"] else "eager",
            "ZeRO-3" if row["reshard_after_forward"] else "ZeRO-2"]
    if row["activation_checkpointing"]:
        plan.append("AC")
    if "mesh" in row:
        plan += [f"mesh {row['mesh']}", f"{row['reduce_dtype']} reduce"]
    if row.get("grad_accum", 1) > 1:
        plan.append(f"x{row['grad_accum']} accumulation")
        if row.get("accum_dtype", row["reduce_dtype"]) != row["reduce_dtype"]:
            plan.append(f"{row['accum_dtype']} accumulation")
    return f"{row['variant']} ({', '.join(plan)})"
