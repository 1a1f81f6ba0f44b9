"""The data formats, told apart by their columns, and what the loss trains on in each.

- `text`: a `text` column; every token is trained on.
- `prompt-completion`: `prompt` and `completion` columns; the completion is trained on.
- `messages`: a `messages` column of `{role, content}` lists, rendered with the tokenizer's chat
  template; the assistant turns are trained on.
`--loss-tokens all` trains on every token of every format (TRL's `completion_only_loss=False`).
"""

from __future__ import annotations

from typing import Sequence

from training.data.tokenize import Encoder, Tokens, TokenizeError

FORMATS = {"messages": ("messages",), "prompt-completion": ("prompt", "completion"),
           "text": ("text",)}
ROLES = ("system", "user", "assistant", "tool")


class RowError(ValueError):
    """One row cannot be trained on; the message says why (the caller adds file and row)."""


def detect(columns: Sequence[str]) -> str:
    """The format whose columns are present (messages first: a chat set may carry a `text`)."""
    for name, needed in FORMATS.items():
        if all(c in columns for c in needed):
            return name
    raise RowError(f"no `text`, `prompt` + `completion` or `messages` column (found "
                   f"{', '.join(columns) or 'none'})")


def tokens(row: dict, fmt: str, enc: Encoder, loss_tokens: str) -> Tokens:
    """Ids and trained flags of one row; a row with nothing to train on is an error."""
    try:
        if fmt == "text":
            ids, trained = enc.text(_string(row, "text"))
        elif fmt == "prompt-completion":
            ids, trained = enc.prompt_completion(_string(row, "prompt"),
                                                 _string(row, "completion"))
        else:
            ids, trained = enc.chat(_messages(row.get("messages")))
    except TokenizeError as e:
        raise RowError(str(e)) from None
    if loss_tokens == "all":
        trained = [True] * len(ids)
    # The first token of a document is never a label (nothing before it in its document).
    if not any(trained[1:]):
        what = {"text": "empty text", "prompt-completion": "an empty completion",
                "messages": "no assistant turn"}[fmt]
        raise RowError(f"no token to train on ({what})")
    return ids, trained


def _string(row: dict, column: str) -> str:
    value = row.get(column)
    if not isinstance(value, str):
        raise RowError(f"`{column}` must be a string (got {type(value).__name__})")
    return value


def _messages(value) -> list[dict]:
    if not isinstance(value, (list, tuple)) or not value:
        raise RowError("`messages` must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) \
                or m.get("role") not in ROLES:
            raise RowError(f"messages[{i}] must be {{\"role\": one of {list(ROLES)}, "
                           f"\"content\": a string}} (got {m!r:.80})")
        out.append({"role": m["role"], "content": m["content"]})
    return out
