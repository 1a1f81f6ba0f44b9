"""--sample-prompts N: greedy answers of the base and the fine-tuned model to the first N prompts
of the evaluation set (--eval-data's rows, or the documents --eval-fraction holds out of --data),
side by side, so a user reads what changed. A chat row's prompt is its turns before the last
assistant turn, rendered with the export's chat template and a generation prompt; a
prompt/completion row's is its prompt. Generation stops where the export's generation config
stops it (the end of a chat turn)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from training.config import TrainConfig

SAMPLES_FILE = "samples.jsonl"
MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class Prompt:
    messages: list[dict] | None  # a chat row's turns before its last assistant turn
    text: str | None  # a prompt/completion row's prompt
    reference: str  # what the data answers


def _prompt(row: dict) -> Prompt | None:
    if "chosen" in row and "rejected" in row:
        return _preference_prompt(row)
    messages = row.get("messages")
    if isinstance(messages, list):
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"),
                   default=None)
        if last:
            return Prompt(messages[:last], None, messages[last]["content"])
        return None
    if isinstance(row.get("prompt"), str):
        return Prompt(None, row["prompt"], str(row.get("completion", "")))
    return None  # a `text` row has no prompt


def _preference_prompt(row: dict) -> Prompt | None:
    """A preference row's prompt (explicit, or TRL's extract_prompt), `chosen` the reference;
    a conversation's prompt goes through the chat template."""
    from training.data.formats import RowError
    from training.data.preference import split

    try:
        prompt, chosen, _ = split(row)
    except RowError:
        return None
    if isinstance(chosen, str):
        return Prompt(None, prompt, chosen) if isinstance(prompt, str) else None
    said = next((m.get("content", "") for m in chosen if m.get("role") == "assistant"), "")
    return Prompt(list(prompt), None, said) if prompt else None


def prompts(cfg: TrainConfig, count: int) -> list[Prompt]:
    """The first `count` prompts of the evaluation set, in order: --eval-data's rows, or the
    rows the run's cache held out of --data (cache.held_out_rows: counted after the rows it
    skipped, so a skipped row never turns a training row into a "held-out" one)."""
    from training.data.cache import held_out_rows, sft_encoder
    from training.data.prepare import tokenizer_name
    from training.data.preference import encode_pair
    from training.data.source import Source
    from training.data.tokenize import encoder

    source = Source.open(cfg.eval_data or cfg.data, "--eval-data" if cfg.eval_data else "--data")
    if cfg.eval_data:
        rows = (row for _, _, row in source.rows())
    else:
        enc = encoder(tokenizer_name(cfg))
        encode = (lambda row: encode_pair(row, enc)) if cfg.objective == "dpo" else \
            sft_encoder(enc, cfg.loss_tokens)
        rows = held_out_rows(source, encode, cfg.eval_fraction)
    out = []
    for row in rows:
        if (p := _prompt(row)) is not None:
            out.append(p)
        if len(out) == count:
            break
    return out


def _ids(p: Prompt, tokenizer) -> list[int]:
    if p.messages is not None:
        return tokenizer.apply_chat_template(p.messages, add_generation_prompt=True,
                                             tokenize=True, return_dict=False)
    return tokenizer(p.text, add_special_tokens=False)["input_ids"]


def answer(model, tokenizer, generation, batch: list[Prompt]) -> list[str]:
    """Greedy answers of `model`, one prompt at a time (no padding to get wrong)."""
    out = []
    with torch.no_grad():
        for p in batch:
            ids = torch.tensor([_ids(p, tokenizer)], device=model.device)
            new = model.generate(ids, generation_config=generation, do_sample=False,
                                 max_new_tokens=MAX_NEW_TOKENS, attention_mask=torch.ones_like(ids))
            out.append(tokenizer.decode(new[0, ids.shape[1]:], skip_special_tokens=True))
    return out


def rows(batch: list[Prompt], answers: dict[str, list[str]]) -> list[dict]:
    """samples.jsonl's rows: the prompt, the data's answer, and each model's."""
    return [{"prompt": p.messages if p.messages is not None else p.text,
             "reference": p.reference, **{k: v[i] for k, v in answers.items()}}
            for i, p in enumerate(batch)]


def render(table: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in table)


def log_lines(table: list[dict]) -> list[str]:
    out = []
    for i, r in enumerate(table, 1):
        prompt = r["prompt"][-1]["content"] if isinstance(r["prompt"], list) else r["prompt"]
        out += [f"sample {i}: {prompt!r}", f"  reference {r['reference']!r}",
                f"  base      {r.get('base')!r}", f"  tuned     {r.get('tuned')!r}"]
    return out
