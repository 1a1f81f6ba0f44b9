"""`python -m bench.dpo`: a DPO step's tokens/s and peak memory on one GPU, against the planner.

The job's engine on one rank (bench/lora.py `measure_run`, so the rows are comparable with its
SFT ones), `--objective dpo` on preference pairs made from the shipped instruction set (chosen:
a row's own answer; rejected: the next different answer, to the same question), packed by the
job's PairCache (as many whole pairs a row as fit), the `bytes` tokenizer on the shape's own
vocabulary. `tokens_per_s` counts the rows' tokens, `pair_tokens_per_s` only the pairs' (the
rows' end padding left out: what a step really trains on). Runs:
  lora-large   --large-model (7B) with --lora-rank under --memory-budget-gib: the reference is
               the same model with its adapters off, one no-grad forward more per micro-batch
  full-budget  --model (1.5B), full fine-tuning under --memory-budget-gib (the planner's
               refusal on one GPU, as bench.lora's, is the row)
  full         the same on the whole GPU; its reference table is computed before the steps
Random init: the losses only show the step runs (the first is ln 2).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from bench import lora
from bench.command import start

KIND = "dpo"
RUNS = ("lora-large", "full-budget", "full")


def pairs_file(path: str) -> str:
    """The shipped set as preference pairs: each question's own answer against the next's."""
    from training.data.synthetic import SHIPPED

    rows = [json.loads(line)["messages"] for line in SHIPPED.read_text().splitlines()]
    with open(path, "w") as f:
        for i, chat in enumerate(rows):
            other = next(o[-1] for o in rows[i + 1:] + rows if o[-1] != chat[-1])
            f.write(json.dumps({"chosen": chat, "rejected": [*chat[:-1], other]}) + "\n")
    return path


def setup_for(cfg, directory: str, data: str):
    """The engine's DPO objective and pair samples (full fine-tuning: its reference table)."""
    def setup(engine):
        import pyarrow.fs as pafs

        from training.data.preference import PairCache, PairSamples
        from training.data.source import Source
        from training.data.tokenize import ByteEncoder
        from training.model.dpo import DpoObjective
        from training.run import reference_logps

        fs = pafs.LocalFileSystem()
        PairCache(fs, directory, "x").build(Source.open(data), ByteEncoder(), cfg.seq_len)
        ref = None if engine.lora else reference_logps.compute(
            engine, PairSamples(fs, directory), engine.plan.micro_batch_size, 0, 1)
        samples = PairSamples(fs, directory, seed=cfg.seed, ref=ref)
        engine.objective = DpoObjective(cfg.dpo_beta, real_share=samples.real_share)
        return samples
    return setup


@dataclasses.dataclass(frozen=True)
class PairShare:
    """Of a pair cache's training rows: the share of their tokens that are pairs' (not the row
    end's padding), and the most pairs a row holds."""
    real: float
    pairs_per_row: int

    @classmethod
    def of(cls, directory: str) -> "PairShare":
        index = json.loads(Path(directory, "index.json").read_text())
        return cls(index["real_tokens"] / (index["samples"] * index["sample_tokens"]),
                   index["pairs_per_row"])


def build_parser():
    """bench.lora's flags (the runs' shapes, steps, budget), with DPO's runs and rates."""
    ap = lora.build_parser()
    ap.prog, ap.description = "python -m bench.dpo", __doc__.split("\n")[0]
    ap.set_defaults(runs=",".join(RUNS), lr=1e-6, lora_lr=5e-5)
    return ap


def main(argv: list[str] | None = None) -> int:
    args, argv = start(build_parser(), argv)

    def measure(run: str, d: str, device) -> dict:
        data = f"{d}/pairs.jsonl"
        if not Path(data).exists():  # one pairs file for every run
            pairs_file(data)
        cfg = dataclasses.replace(lora.run_config(args, run, device.type == "cuda"),
                                  objective="dpo", data=data)
        setup = setup_for(cfg, f"{d}/{run}", data)
        row = {"objective": "dpo", **lora.measure_run(cfg, None, device, setup=setup)}
        if "tokens_per_s" in row:  # the pairs' own tokens, the rows' end padding left out
            share = PairShare.of(f"{d}/{run}")
            row.update(pairs_per_row=share.pairs_per_row, real_share=share.real,
                       pair_tokens_per_s=row["tokens_per_s"] * share.real)
        return row

    return lora.run_all(args, argv, KIND, RUNS, measure)


if __name__ == "__main__":
    sys.exit(main())
