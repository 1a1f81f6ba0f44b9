"""`python -m training.data.synthetic`: the shipped instruction set and preference pairs,
generated (never typed).

Small tasks whose answers follow from their prompts alone (reverse, capitalize or count the
letters of a made-up word, add two numbers, sort a few), in the `messages` format, so that what a
fine-tune learns shows in the held-out loss: a model that has learned the tasks answers prompts
it never saw. The pairs (`pairs.jsonl`, for `--objective dpo`) take the first PAIR_COUNT of
those chats, each chat's own answer chosen and the next different answer to a question of the
same kind rejected (plausible, and wrong), in TRL's implicit-prompt conversational format.
Seeded, so the same command writes the same bytes (a test checks the shipped files).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Callable

SHIPPED = Path(__file__).resolve().parent / "sample_data" / "instructions.jsonl"
PAIRS = SHIPPED.with_name("pairs.jsonl")
COUNT, SEED, PAIR_COUNT = 2500, 0, 1000
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))


def _reverse(rng: random.Random) -> tuple[str, str]:
    w = _word(rng)
    return f'Reverse the letters of "{w}".', w[::-1]


def _capitalize(rng: random.Random) -> tuple[str, str]:
    w = _word(rng)
    return f'Write "{w}" in capital letters.', w.upper()


def _count(rng: random.Random) -> tuple[str, str]:
    w = _word(rng)
    return f'How many letters does "{w}" have?', str(len(w))


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 999), rng.randint(0, 999)
    return f"What is {a} + {b}?", str(a + b)


def _sort(rng: random.Random) -> tuple[str, str]:
    xs = [rng.randint(0, 99) for _ in range(rng.randint(3, 6))]
    return f"Sort in ascending order: {', '.join(map(str, xs))}", ", ".join(map(str, sorted(xs)))


TASKS: tuple[Callable[[random.Random], tuple[str, str]], ...] = (
    _reverse, _capitalize, _count, _add, _sort)


def examples(count: int = COUNT, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        prompt, answer = rng.choice(TASKS)(rng)
        out.append({"messages": [{"role": "user", "content": prompt},
                                 {"role": "assistant", "content": answer}]})
    return out


def preference_pairs(chats: list[dict], count: int = PAIR_COUNT) -> list[dict]:
    """The first `count` chats as pairs: its answer chosen, the next different answer to a
    question of the same kind (the prompt's first word) rejected."""
    turns = [c["messages"] for c in chats]
    out = []
    for i, chat in enumerate(turns[:count]):
        kind, answer = chat[0]["content"].split()[0], chat[-1]["content"]
        wrong = next(t[-1] for t in turns[i + 1:] + turns[:i]
                     if t[0]["content"].split()[0] == kind and t[-1]["content"] != answer)
        out.append({"chosen": chat, "rejected": [*chat[:-1], wrong]})
    return out


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m training.data.synthetic",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=SHIPPED)
    ap.add_argument("--pairs-out", type=Path, default=PAIRS)
    ap.add_argument("--count", type=int, default=COUNT)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    chats = examples(args.count, args.seed)
    args.out.write_text(render(chats))
    args.pairs_out.write_text(render(preference_pairs(chats)))


if __name__ == "__main__":
    main()
