"""`python -m bench.precision`: how much bf16 gradient accumulation changes a step.

The default plan accumulates the unsharded gradients of its micro-batches in bf16 when it reduces
in bf16 (FSDP2 clamps a reduce dtype equal to the bf16 param dtype to "none" and adds bf16 grads
in place: `_fsdp_param.py`, `to_accumulated_grad_if_needed`); one GPU accumulates exactly as many.
Three engines of the job (`training.step.engine.build_engine`, one rank) take the same steps on the
same text:
  - `fp32-reduce`: fp32 accumulation and reduce (the reference),
  - `bf16`: the default plan's bf16 accumulation and reduce,
  - `fp32-accum`: fp32 accumulation, bf16 reduce once per step (`--accum-dtype fp32`).
Measured: (1) at the same weights (step 1 from the shared init, and step N+1 with the reference's
trained weights and Adam state copied into the others), each variant's clipped gradient and its
AdamW update against the reference's (relative error, cosine); (2) each variant's own loss over
N steps from the same init. Text: UTF-8 bytes (the job's `bytes` tokenizer) of the shipped sample,
then of text files on the machine (the GPU machine has no internet); the model is random-init.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

from bench.command import refuse, start
from bench.single import environment, one_rank, write_json
from training.config import TrainConfig
from training.flags import add_config_flags

KIND = "precision"
REFERENCE = "fp32-reduce"
VARIANTS = {REFERENCE: {"reduce_dtype": "fp32"}, "bf16": {"reduce_dtype": "bf16"},
            "fp32-accum": {"reduce_dtype": "bf16", "accum_dtype": "fp32"}}
SAMPLE = Path(__file__).resolve().parent.parent / "training/data/sample_data/tiny_corpus.jsonl"
TEXT_FILES = ("*.md", "*.rst", "*.txt", "METADATA")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.precision",
                                 description=__doc__.split("\n")[0])
    add_config_flags(ap, ("model", "seq_len", "micro_batch_size", "grad_accum", "lr", "compile"))
    ap.set_defaults(model="qwen2.5-1.5b", seq_len=2048, micro_batch_size=1, grad_accum=16,
                    lr=3e-4, compile=False)
    ap.add_argument("--steps", type=int, default=12, help="N: steps each variant trains")
    ap.add_argument("--corpus", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
                    help="directory whose text files (sorted) follow the shipped sample")
    ap.add_argument("--json-out", type=Path, default=None)
    return ap


def corpus_tokens(count: int, corpus: Path) -> tuple[np.ndarray, dict]:
    """`count` byte tokens: the shipped sample's texts, then the corpus's text files in sorted
    order, each document followed by the end-of-text id; and where they came from."""
    from training.data.tokenize import ByteEncoder

    texts = [json.loads(line)["text"] for line in SAMPLE.read_text().splitlines() if line]
    files = [SAMPLE]
    have = sum(len(t.encode()) + 1 for t in texts)
    for path in sorted(p for pattern in TEXT_FILES for p in corpus.rglob(pattern)):
        if have >= count:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        files.append(path)
        have += len(text.encode()) + 1
    enc = ByteEncoder()
    tokens = np.asarray([i for t in texts for i in enc.encode(t) + [enc.eos]], dtype=np.int64)
    if len(tokens) < count:
        raise SystemExit(f"error: {corpus} holds {len(tokens)} bytes of text; the run needs "
                         f"{count}: give --corpus a larger directory or fewer --steps")
    tokens = tokens[:count]
    return tokens, {"files": len(files), "tokens": count, "tokenizer": "bytes",
                    "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()[:16]}


class _Capture:
    """Stands in for the engine's optimizer for one step: keeps the (clipped) gradient shards it
    steps with and the update it applies, in host memory (three 1.5B engines fill most of an
    H200 already)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.optimizer, self.param_groups = optimizer, optimizer.param_groups
        self.grads: list[torch.Tensor] = []
        self.update: list[torch.Tensor] = []

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    @torch.no_grad()
    def step(self) -> None:
        params = self._params()
        self.grads = [_local(p.grad).cpu() for p in params]
        before = [_local(p).clone() for p in params]
        self.optimizer.step()
        self.update = [(_local(p) - b).cpu() for p, b in zip(params, before)]

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def compare(got: list[torch.Tensor], ref: list[torch.Tensor], device: torch.device) -> dict:
    """Relative error and cosine of two tensor lists as flat vectors (fp64 sums on `device`, one
    tensor pair at a time)."""
    dot = diff = a2 = b2 = 0.0
    for a, b in zip(got, ref):
        a, b = a.to(device, torch.float64), b.to(device, torch.float64)
        dot += float((a * b).sum())
        diff += float((a - b).square().sum())
        a2, b2 = a2 + float(a.square().sum()), b2 + float(b.square().sum())
    return {"rel_error": (diff / b2) ** 0.5 if b2 else 0.0,
            "cosine": dot / (a2 * b2) ** 0.5 if a2 and b2 else 1.0}


def _same_step(engines: dict, micro, lr: float, grad_clip: float) -> dict:
    """Every variant steps from the weights and Adam state they share now; their gradients and
    updates against the reference's. Leaves each engine where its own step took it."""
    from training.step.engine import train_step

    out, ref = {}, None
    for name, engine in engines.items():  # the reference first; only its capture is kept
        cap = _Capture(engine.optimizer)
        real, engine.optimizer = engine.optimizer, cap
        try:
            loss = float(train_step(engine, micro, lr, grad_clip))
        finally:
            engine.optimizer = real
        ref = ref or cap
        out[name] = {"loss": loss, "grad": compare(cap.grads, ref.grads, engine.device),
                     "update": compare(cap.update, ref.update, engine.device)}
        del cap
    return out


def _copy_state(src, dst) -> None:
    """dst's weights and Adam state become src's."""
    with torch.no_grad():
        for p, q in zip(dst.model.parameters(), src.model.parameters()):
            _local(p).copy_(_local(q))
    dst.optimizer.load_state_dict(copy.deepcopy(src.optimizer.state_dict()))


def measure(args: argparse.Namespace, device: torch.device) -> dict:
    from training.step.engine import build_engine
    from training.model.model import model_config

    base = TrainConfig(model=args.model, seq_len=args.seq_len,
                       micro_batch_size=args.micro_batch_size,
                       grad_accum=args.grad_accum, lr=args.lr, warmup_steps=0, num_workers=1,
                       compile=args.compile)
    per_step = base.micro_batch_size * base.grad_accum
    tokens, corpus = corpus_tokens((args.steps + 1) * per_step * (base.seq_len + 1), args.corpus)
    rows = torch.from_numpy(tokens.astype(np.int64)).view(args.steps + 1, base.grad_accum,
                                                          base.micro_batch_size, base.seq_len + 1)

    def micro(step: int):
        return [(r[:, :-1].to(device), r[:, 1:].to(device)) for r in rows[step]]

    model_cfg = model_config(base.model)  # the real vocabulary; the byte ids use its first 257
    engines = {name: build_engine(dataclasses.replace(base, **kw), model_cfg, device)
               for name, kw in VARIANTS.items()}
    started = time.perf_counter()
    at_init = _same_step(engines, micro(0), base.lr, base.grad_clip)
    from training.step.engine import train_step

    losses = {name: [at_init[name]["loss"]] for name in engines}
    for step in range(1, args.steps):
        for name, engine in engines.items():
            losses[name].append(float(train_step(engine, micro(step), base.lr, base.grad_clip)))
    for name, engine in engines.items():
        if name != REFERENCE:
            _copy_state(engines[REFERENCE], engine)
    trained = _same_step(engines, micro(args.steps), base.lr, base.grad_clip)
    last = max(1, args.steps // 4)
    summary = {name: {"step1_grad": at_init[name]["grad"], "step1_update": at_init[name]["update"],
                      f"step{args.steps + 1}_grad": trained[name]["grad"],
                      f"step{args.steps + 1}_update": trained[name]["update"],
                      "losses": losses[name],
                      "final_loss": sum(losses[name][-last:]) / last}
               for name in engines}
    return {"kind": KIND, "settings": {**{k: getattr(base, k) for k in (
                "model", "seq_len", "micro_batch_size", "grad_accum", "lr", "compile",
                "grad_clip")}, "steps": args.steps, "init": "random",
                "final_loss_over_last_steps": last},
            "corpus": corpus, "variants": summary, "seconds": time.perf_counter() - started}


def table(result: dict) -> str:
    s = result["settings"]
    n = s["steps"] + 1
    lines = [f"{s['model']} random init, {s['grad_accum']} micro-batches of "
             f"{s['micro_batch_size']} x {s['seq_len']} byte tokens, against {REFERENCE}",
             f"{'variant':<12} {'grad rel err':>12} {'grad cos':>9} {'upd cos':>9} "
             f"{'@' + str(n) + ' grad err':>13} {'upd cos':>9} {'upd err':>9} {'final loss':>10}"]
    for name, v in result["variants"].items():
        g1, u1 = v["step1_grad"], v["step1_update"]
        gn, un = v[f"step{n}_grad"], v[f"step{n}_update"]
        lines.append(f"{name:<12} {g1['rel_error']:>12.2e} {g1['cosine']:>9.6f} "
                     f"{u1['cosine']:>9.6f} {gn['rel_error']:>13.2e} {un['cosine']:>9.6f} "
                     f"{un['rel_error']:>9.2e} {v['final_loss']:>10.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args, argv = start(build_parser(), argv)
    if args.steps < 1:
        return refuse("--steps must be at least 1")
    with one_rank() as device:
        result = measure(args, device)
        result["env"] = environment(device, argv, "bench.precision")
    print(table(result))
    write_json(result, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
