"""Throughput accounting: FLOPs per token (input embedding left out), MFU against a cited peak
table, metrics.csv and plot."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from training.model.rewards import EVAL_REWARD_METRICS, REWARD_METRICS

# Dense bf16 tensor-core peaks from the vendors' datasheets (no sparsity). MFU is reported against
# these unless a measured matmul rate is given (the benchmark measures one).
PEAK_BF16_TFLOPS: dict[str, float] = {
    "NVIDIA H200": 989.0,  # H200 SXM datasheet (same as H100 SXM): 1,979 TFLOP/s with sparsity
    "NVIDIA H100 80GB HBM3": 989.0,  # H100 SXM datasheet
    "NVIDIA L4": 121.0,  # L4 datasheet: 242 TFLOP/s bf16 with sparsity
    "NVIDIA L40S": 362.0,  # L40S datasheet: 733 TFLOP/s bf16 with sparsity
}

CSV_FIELDS = ("step", "loss", "eval_loss", "lr", "grad_norm", "tokens_per_s",
              "tokens_per_s_per_worker", "mfu", "step_time_s", "peak_mem_gib")


def flops_per_token(num_params: int, num_layers: int, hidden: int, seq_len: int,
                    frozen: int = 0, embedding: int = 0) -> float:
    """Training FLOPs per token: 6N for the weights + attention 12*L*H*S; a `frozen` weight
    (LoRA's base) gets no weight gradient: 4 instead of 6. N leaves out the `embedding`
    parameters, the input embedding of an untied model (`input_embedding`): a lookup, no matmul
    (PaLM's MFU, torchtitan's `get_num_flop_per_token`); a tied matrix is the LM head's, whose
    matmul counts. A LoRA base's embedding is among its frozen weights."""
    frozen = max(0, frozen - embedding) if frozen else 0
    return 6.0 * (num_params - embedding) - 2.0 * frozen + 12.0 * num_layers * hidden * seq_len


def model_flops_per_token(model_cfg, num_params: int, seq_len: int,
                          trainable: int | None = None) -> float:
    """`flops_per_token` of a model of this config (its layers, width and input embedding) with
    `num_params` parameters, `trainable` of them trained (None: all): the one count behind the
    job's MFU, the benchmark's and the step model's compute, so they never disagree."""
    frozen = 0 if trainable is None else num_params - trainable
    return flops_per_token(num_params, model_cfg.num_hidden_layers, model_cfg.hidden_size,
                           seq_len, frozen=frozen, embedding=input_embedding(model_cfg))


def input_embedding(model_cfg) -> int:
    """The parameters `flops_per_token` leaves out: the input embedding when the LM head has
    its own matrix; none when tied (the one matrix is the head's, counted)."""
    if getattr(model_cfg, "tie_word_embeddings", False):
        return 0
    return model_cfg.vocab_size * model_cfg.hidden_size


def peak_flops(device_name: str | None) -> float | None:
    """Peak bf16 FLOP/s for a GPU name, or None (CPU, unknown GPU): MFU is then not reported."""
    if device_name is None:
        return None
    tflops = PEAK_BF16_TFLOPS.get(device_name)
    return tflops * 1e12 if tflops else None


def mfu(tokens_per_s_per_device: float, flops_per_tok: float, peak: float | None) -> float | None:
    if not peak:
        return None
    return tokens_per_s_per_device * flops_per_tok / peak


def merge_csv(existing: str, rows: list[dict]) -> str:
    """metrics.csv text with `rows` appended; rows of steps already present are replaced (resume)."""
    by_step = {int(r["step"]): r for r in csv.DictReader(io.StringIO(existing))} if existing else {}
    # --objective dpo's columns (TRL's names), only in the files of runs that have them
    fields = CSV_FIELDS + tuple(k for k in REWARD_METRICS + EVAL_REWARD_METRICS
                                if any(r.get(k) not in (None, "") for r in [*by_step.values(), *rows]))
    for r in rows:
        by_step[int(r["step"])] = {k: r.get(k) for k in fields}
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for step in sorted(by_step):
        writer.writerow(by_step[step])
    return out.getvalue()


def plot_csv(csv_text: str, png_path: Path) -> None:
    """Training and evaluation loss, and throughput, against step, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(io.StringIO(csv_text)))

    def series(column: str) -> tuple[list[int], list[float]]:
        """The steps that have `column` (evaluation: only the evaluated ones) and its values."""
        have = [r for r in rows if r.get(column)]
        return [int(r["step"]) for r in have], [float(r[column]) for r in have]

    preference = bool(series("rewards/accuracies")[0])
    fig, (ax1, ax2, *ax3) = plt.subplots(3 if preference else 2, 1, sharex=True,
                                         figsize=(7, 9 if preference else 6))
    if preference:  # --objective dpo: TRL's reward accuracy and margin
        ax3[0].plot(*series("rewards/accuracies"), marker=".", label="reward accuracy")
        ax3[0].plot(*series("rewards/margins"), marker=".", label="reward margin")
        if series("eval_rewards/accuracies")[0]:
            ax3[0].plot(*series("eval_rewards/accuracies"), marker="o", label="eval accuracy")
        ax3[0].legend()
    ax1.plot(*series("loss"), marker=".", label="training")
    if series("eval_loss")[0]:
        ax1.plot(*series("eval_loss"), marker="o", color="C2", label="evaluation")
        ax1.legend()
    ax1.set_ylabel("loss")
    ax2.plot(*series("tokens_per_s"), marker=".", color="C1")
    ax2.set_ylabel("tokens/s (all workers)")
    (ax3 or [ax2])[0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(png_path, dpi=80)
    plt.close(fig)
