"""Token ids of documents and which of them are trained on, for the built-in byte tokenizer or a
Hugging Face one.

One document is what the tokenizer's own `encode` produces (with the special tokens the
tokenizer adds itself, such as Llama 3's and Gemma's BOS) followed by its EOS, when it defines
one; no id is ever invented for a missing EOS. Chat documents are the tokenizer's chat template,
which ends each turn itself. Qwen2.5's template has no `{% generation %}` block, so transformers'
`return_assistant_tokens_mask` gives no mask for it (transformers #34172, TRL PR #4201): the
assistant spans are found instead by rendering the conversation's prefixes and taking the
differences of their token lengths, which holds wherever a prefix's tokens are a prefix of the
whole conversation's (checked for every conversation; a template where it does not is an error).
"""

from __future__ import annotations

import functools
from typing import Sequence
from training.errors import InputError

BYTES = "bytes"  # built-in tokenizer: UTF-8 bytes, end-of-text 256 (no download, for the demo)
BYTES_VOCAB = 257


class TokenizeError(InputError):
    """A document cannot be tokenized as its format says (the caller adds file and row)."""


Tokens = tuple[list[int], list[bool]]  # ids, and which of them the loss counts


class Encoder:
    """The tokenizer of a run: plain documents, prompt + completion, and chat conversations."""

    eos: int | None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def vocab_size(self) -> int:
        raise NotImplementedError

    def text(self, text: str) -> Tokens:
        ids = self.encode(text) + ([self.eos] if self.eos is not None else [])
        return ids, [True] * len(ids)

    def prompt_completion(self, prompt: str, completion: str) -> Tokens:
        """As TRL's SFTTrainer: the completion is what `prompt + completion` adds to `prompt`."""
        n_prompt = len(self.encode(prompt))
        ids, _ = self.text(prompt + completion)
        return ids, [i >= n_prompt for i in range(len(ids))]

    def chat(self, messages: Sequence[dict]) -> Tokens:
        raise NotImplementedError


class ByteEncoder(Encoder):
    """UTF-8 bytes; chats in a built-in format: each turn `<|role|>\\n` + content, an assistant
    turn ended by the end-of-text id (trained on, so the model learns to stop), others by `\\n`."""

    eos = BYTES_VOCAB - 1

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def vocab_size(self) -> int:
        return BYTES_VOCAB

    def chat(self, messages: Sequence[dict]) -> Tokens:
        ids: list[int] = []
        trained: list[bool] = []
        for m in messages:
            header = self.encode(f"<|{m['role']}|>\n")
            assistant = m["role"] == "assistant"
            body = self.encode(m["content"]) + ([self.eos] if assistant else self.encode("\n"))
            ids += header + body
            trained += [False] * len(header) + [assistant] * len(body)
        return ids, trained


class HFEncoder(Encoder):
    def __init__(self, name: str):
        self.tok = hf_tokenizer(name)
        self.eos = self.tok.eos_token_id
        self.special = {i for i, t in self.tok.added_tokens_decoder.items() if t.special}

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text))  # add_special_tokens as the tokenizer defines it

    def vocab_size(self) -> int:
        return len(self.tok)

    def _render(self, messages: Sequence[dict], **kwargs) -> list[int]:
        text = self.tok.apply_chat_template(list(messages), tokenize=False, **kwargs)
        return list(self.tok.encode(text, add_special_tokens=False))

    def chat(self, messages: Sequence[dict]) -> Tokens:
        """The template's rendering; each assistant turn trained from its content to its
        end-of-turn token inclusive: the tokenizer's EOS, else the turn's last special token
        (Qwen2.5 Instruct's EOS is `<|im_end|>`; the base model's is `<|endoftext|>`, and its
        turns still end with `<|im_end|>`), not the template's newline after it."""
        if self.tok.chat_template is None:
            raise TokenizeError("the tokenizer has no chat template for `messages` data; use "
                                "a tokenizer with one (--tokenizer) or prompt/completion data")
        ids = self._render(messages)
        trained = [False] * len(ids)
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start = self._prefix_length(messages[:i], ids, add_generation_prompt=True)
            end = self._prefix_length(messages[:i + 1], ids)
            span = ids[start:end]
            ends = [k for k, t in enumerate(span) if t == self.eos] or \
                [k for k, t in enumerate(span) if t in self.special][-1:]
            if ends:
                end = start + ends[0] + 1
            trained[start:end] = [True] * (end - start)
        return ids, trained

    def _prefix_length(self, messages: Sequence[dict], ids: list[int], **kwargs) -> int:
        prefix = self._render(messages, **kwargs) if messages else []
        if ids[:len(prefix)] != prefix:
            raise TokenizeError("the chat template does not render a conversation's first turns "
                                "as a prefix of the whole conversation, so its assistant tokens "
                                "cannot be found; use prompt/completion data")
        return len(prefix)


def encoder(name: str) -> Encoder:
    return ByteEncoder() if name == BYTES else HFEncoder(name)


@functools.cache
def hf_tokenizer(name: str):
    """Loaded once per process."""
    from transformers import AutoTokenizer

    from training.model.loading import local_dir

    return AutoTokenizer.from_pretrained(local_dir(name))  # s3://: its files, copied here
