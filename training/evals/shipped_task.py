"""`python -m training.evals.shipped_task`: the project's own lm-eval task, built from the shipped
instruction set (never typed), so `make demo` shows the harness with no download.

Its questions are the documents `--demo`'s 5% hold-out keeps out of training (training/data/
cache.py `held_out_rows`, the split's own definition), so the fine-tuned model never saw them; each gets its true answer and three
others of the same kind of question (the same first word), seeded, so the same command
writes the same bytes (a test checks the shipped file)."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from training.data.cache import held_out_rows, sft_encoder
from training.data.source import Source
from training.data.synthetic import SHIPPED
from training.data.tokenize import ByteEncoder

TASK_DIR = Path(__file__).resolve().parent / "instructions_task"
DATA = TASK_DIR / "instructions_mc.jsonl"
HELD_OUT, CHOICES, SEED = 0.05, 4, 0  # HELD_OUT: --demo's --eval-fraction


def _kind(question: str) -> str:
    return question.split()[0]


def build(source: Path = SHIPPED) -> list[dict]:
    """One row per held-out document: {question, choices, label}."""
    held = held_out_rows(Source.open(str(source)), sft_encoder(ByteEncoder(), "completion"),
                         HELD_OUT)
    pairs = [(r["messages"][0]["content"], r["messages"][1]["content"]) for r in held]
    answers: dict[str, list[str]] = {}
    for q, a in pairs:
        answers.setdefault(_kind(q), []).append(a)
    rng, out = random.Random(SEED), []
    for q, a in pairs:
        others = sorted(set(answers[_kind(q)]) - {a})
        if len(others) < CHOICES - 1:
            continue  # too few answers of its kind to choose from
        choices = rng.sample(others, CHOICES - 1)
        label = rng.randrange(CHOICES)
        choices.insert(label, a)
        out.append({"question": q, "choices": choices, "label": label})
    return out


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DATA)
    args = ap.parse_args(argv)
    args.out.write_text(render(build()))


if __name__ == "__main__":
    main()
