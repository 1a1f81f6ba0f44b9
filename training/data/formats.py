"""The data formats, one record each: the columns that tell it apart, how a row becomes tokens,
what the loss trains on, and what an untrainable row lacks.

- `text`: a `text` column; every token is trained on.
- `prompt-completion`: `prompt` and `completion` columns; the completion is trained on.
- `messages`: a `messages` column of `{role, content}` lists, rendered with the tokenizer's chat
  template; the assistant turns are trained on. `content: null` (OpenAI's form for a turn with
  nothing to say) is an empty content, not the text "None" Jinja would render. A turn with
  `tool_calls` is refused by name, and its row skipped (cache.py): the job renders contents
  only, and training the turn without its call would teach the model to drop calls. An
  assistant turn's `reasoning_content` (Qwen3's thinking) is kept for templates that render it.
`--loss-tokens all` trains on every token of every format (TRL's `completion_only_loss=False`).

Standard library only at import (tokenize.py loads transformers when a tokenizer is asked for),
so the configuration's help can be written from `FORMATS` without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from training.data.tokenize import Encoder, Encoded, TokenizeError

ROLES = ("system", "user", "assistant", "tool")


class RowError(ValueError):
    """One row cannot be trained on; the message says why (the caller adds file and row)."""


@dataclass(frozen=True)
class Format:
    name: str  # as the index and the run summary record it
    columns: tuple[str, ...]  # all present: a row is of this format
    encode: Callable[[dict, Encoder], Encoded]  # ids, and what --loss-tokens completion trains
    trains: str  # what --loss-tokens completion trains on, for the log
    empty: str  # what a row with nothing to train on lacks

    def quoted(self) -> str:
        """The columns as the help and the errors name them: `prompt` + `completion`."""
        return " + ".join(f"`{c}`" for c in self.columns)

    def encode_row(self, row: dict, enc: Encoder, loss_tokens: str) -> Encoded:
        """Ids and trained flags of one row of this format (told from the data's first row); a
        row with nothing to train on is an error."""
        missing = [c for c in self.columns if c not in row]
        if missing:
            raise RowError(f"no `{missing[0]}` column (the data is {self.name}: "
                           f"{' + '.join(self.columns)}, from its first row)")
        try:
            ids, trained = self.encode(row, enc)
        except TokenizeError as e:
            raise RowError(str(e)) from None
        if loss_tokens == "all":
            trained = [True] * len(ids)
        # The first token of a document is never a label (nothing before it in its document).
        if not any(trained[1:]):
            raise RowError(f"no token to train on ({self.empty})")
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
        content = m.get("content", "") if isinstance(m, dict) else None
        if not isinstance(m, dict) or "content" not in m or \
                not isinstance(content, (str, type(None))) or m.get("role") not in ROLES:
            raise RowError(f"messages[{i}] must be {{\"role\": one of {list(ROLES)}, "
                           f"\"content\": a string or null}} (got {m!r:.80})")
        if m.get("tool_calls"):
            raise RowError(f"messages[{i}] has `tool_calls`: tool-call turns are not trained "
                           "(only contents are rendered, and the call would be lost)")
        reasoning = m.get("reasoning_content")
        out.append({"role": m["role"], "content": content or "",
                    **({"reasoning_content": reasoning} if isinstance(reasoning, str) else {})})
    return out


TEXT = Format("text", ("text",), lambda row, enc: enc.text(_string(row, "text")),
              trains="every token", empty="empty text")
PROMPT_COMPLETION = Format(
    "prompt-completion", ("prompt", "completion"),
    lambda row, enc: enc.prompt_completion(_string(row, "prompt"), _string(row, "completion")),
    trains="the completions", empty="an empty completion")
MESSAGES = Format("messages", ("messages",), lambda row, enc: enc.chat(_messages(row["messages"])),
                  trains="the assistant turns", empty="no assistant turn")
FORMATS = (TEXT, PROMPT_COMPLETION, MESSAGES)
BY_NAME = {f.name: f for f in FORMATS}


def listing(word: Callable[[Format], str], last: str = " or ") -> str:
    """Every format, as `word` names it, in one phrase: `listing(Format.quoted)` is "`text`,
    `prompt` + `completion` or `messages`"."""
    words = [word(f) for f in FORMATS]
    return ", ".join(words[:-1]) + last + words[-1]


def detect(columns: Sequence[str]) -> Format:
    """The format whose columns are present, the most specific first (a chat set may carry a
    `text`, and so may a prompt/completion set)."""
    for fmt in reversed(FORMATS):
        if all(c in columns for c in fmt.columns):
            return fmt
    raise RowError(f"no {listing(Format.quoted)} column (found {', '.join(columns) or 'none'})")
