"""Token ids of documents and which of them are trained on, for the built-in byte tokenizer or a
Hugging Face one.

One document is what the tokenizer's own `encode` produces (with the special tokens the
tokenizer adds itself, such as Llama 3's and Gemma's BOS) followed by its EOS, when it defines
one; no id is ever invented for a missing EOS. Text typed in a document is text: special-token
text in `text`, `prompt` or `completion` is tokenized as the characters it is
(`split_special_tokens`), never as that special token.

Chat documents are the tokenizer's chat template, which ends each turn itself. Few templates have
a `{% generation %}` block, so transformers' `return_assistant_tokens_mask` gives no mask for
them (transformers #34172, TRL PR #4201). Each assistant turn is instead what the template
renders after that turn's generation prompt (the turns before it, `add_generation_prompt`):
Qwen3's `<think>` block, then the content, trained through the turn's end-of-turn token; the
default system prompt and the header before a first assistant turn stay untrained. Where the
template renders earlier turns as a prefix of the whole conversation (Qwen2.5, Llama 3, Gemma 3,
Phi-3.5) the row is exactly its rendering; where it drops a history turn's reasoning (Qwen3,
Qwen3.5) every turn keeps the thinking block it was generated with, as TRL's training templates
render it (tests/training/data/test_chat_families.py holds both against TRL's SFT). Each content
is tokenized apart from the template's text around it, as `generate` produces it after the
prompt's tokens: under Qwen2's pre-tokenizer a content starting with "\n" would otherwise merge
with the header's "\n" into one token that is neither's. Special-token text inside a message is tokenized as text (`_guarded`): the
template's own special tokens structure the turns, and the same text typed by a user would
otherwise end or open one. (Refusing such a row would stop a whole run, the cluster default's on
a public dataset included, for one message about tokenizers.)
"""

from __future__ import annotations

import functools
from typing import Sequence

from training.errors import InputError

BYTES = "bytes"  # built-in tokenizer: UTF-8 bytes, end-of-text 256 (no download, for the demo)
BYTES_VOCAB = 257
BYTES_EOS_TEXT = "<|endoftext|>"  # how the byte tokenizer's export spells id 256
# The byte tokenizer's chat format as a Jinja chat template (its export carries it, so the model
# is prompted exactly as it was trained): ByteEncoder.chat, turn by turn.
BYTES_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
_CONTENT = "\x00assistant content\x00"  # placeholder: where the template puts a turn's content
_GUARD = "\ue000"  # brackets a special token's index where a content typed its text


class TokenizeError(InputError):
    """A document cannot be tokenized as its format says (the caller adds file and row)."""


Encoded = tuple[list[int], list[bool]]  # ids, and which of them the loss counts


class Encoder:
    """The tokenizer of a run: plain documents, prompt + completion, and chat conversations."""

    eos: int | None

    def encode(self, text: str) -> list[int]:
        """A document's tokens, with the special tokens the tokenizer adds itself."""
        raise NotImplementedError

    def encode_plain(self, text: str) -> list[int]:
        """The tokens of `text` alone (no BOS or other added tokens)."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def vocab_size(self) -> int:
        raise NotImplementedError

    def end_of_turn(self) -> int | None:
        """The token that ends an assistant turn (generation stops there), if chats have one."""
        raise NotImplementedError

    def text(self, text: str) -> Encoded:
        ids = self.encode(text) + ([self.eos] if self.eos is not None else [])
        return ids, [True] * len(ids)

    def prompt_completion(self, prompt: str, completion: str) -> Encoded:
        """As TRL's SFTTrainer: the completion is what `prompt + completion` adds to `prompt`.
        Where the two merge into one token across the boundary (`"... is "` + `"Paris"` with a
        BPE that has `" Paris"`), that would train only the EOS; the completion is then tokenized
        on its own after the prompt's tokens (what `generate` sees when given the prompt), as long
        as that spells the same text, else the row is refused."""
        n_prompt = len(prompt_ids := self.encode(prompt))
        ids, _ = self.text(prompt + completion)
        if ids[:n_prompt] != prompt_ids:
            eos = [self.eos] if self.eos is not None else []
            apart = prompt_ids + self.encode_plain(completion) + eos
            if self.decode(apart) != self.decode(ids):
                merged = next((k for k, (a, b) in enumerate(zip(ids, prompt_ids)) if a != b), 0)
                raise TokenizeError(
                    "the prompt's end and the completion's start merge into one token "
                    f"({self.decode(ids[merged:merged + 1])!r}), and tokenized apart they "
                    "do not spell the same text: end the prompt or start the completion at a "
                    "word boundary")
            ids = apart
        return ids, [i >= n_prompt for i in range(len(ids))]

    def chat(self, messages: Sequence[dict]) -> Encoded:
        raise NotImplementedError


class ByteEncoder(Encoder):
    """UTF-8 bytes; chats in a built-in format: each turn `<|role|>\\n` + content, an assistant
    turn ended by the end-of-text id (trained on, so the model learns to stop), others by `\\n`
    (BYTES_CHAT_TEMPLATE renders the same)."""

    eos = BYTES_VOCAB - 1

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    encode_plain = encode

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(BYTES_EOS_TEXT.encode() if i == self.eos else bytes([i])
                        for i in ids).decode(errors="replace")

    def vocab_size(self) -> int:
        return BYTES_VOCAB

    def end_of_turn(self) -> int:
        return self.eos

    def chat(self, messages: Sequence[dict]) -> Encoded:
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
        self.special = {i: t.content for i, t in self.tok.added_tokens_decoder.items()
                        if t.special}
        self._special_texts = sorted(set(self.special.values()))

    def encode(self, text: str) -> list[int]:
        # add_special_tokens as the tokenizer defines it; typed special-token text stays text.
        return list(self.tok.encode(text, split_special_tokens=True))

    def encode_plain(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))

    def vocab_size(self) -> int:
        return len(self.tok)

    def end_of_turn(self) -> int | None:
        """The first special token the template writes after an assistant turn's content
        (Qwen2.5: `<|im_end|>`, also under the base model's EOS `<|endoftext|>`)."""
        if self.tok.chat_template is None:
            return None
        chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _CONTENT}]
        after = self._text(chat).partition(_CONTENT)[2]
        return next((i for i in self._ids(after) if i in self.special), None)

    def _text(self, messages: Sequence[dict], **kwargs) -> str:
        return self.tok.apply_chat_template(list(messages), tokenize=False, **kwargs)

    def _ids(self, rendered: str) -> list[int]:
        """Template text: its special tokens are structure; a guarded content's special-token
        text (`_guarded`) is text."""
        ids: list[int] = []
        for n, piece in enumerate(rendered.split(_GUARD)):
            if n % 2:  # a marker: the index of the special token whose text stood there
                ids += self.encode_plain(self._special_texts[int(piece)])
            elif piece:
                ids += self.tok.encode(piece, add_special_tokens=False)
        return ids

    def chat(self, messages: Sequence[dict]) -> Encoded:
        """Each assistant turn as the template renders it at generation time (after the turns
        before it and the generation prompt), its content tokenized on its own (as `generate`
        produces it after the prompt's tokens), trained from the turn's first generated token
        (a reasoning block, where the template writes one) to its end-of-turn token inclusive
        (the first special token after the content), not the template's newline after that."""
        if self.tok.chat_template is None:
            raise TokenizeError("the tokenizer has no chat template for `messages` data; use "
                                "a tokenizer with one (--tokenizer) or prompt/completion data")
        messages = self._guarded(self._reasoning_apart(messages))
        ids: list[int] = []
        trained_from: list[tuple[int, int]] = []  # (turn's first token, content's first token)
        for text, kind in self._pieces(messages):
            if kind == "turn":
                trained_from.append((len(ids), len(ids)))
            elif kind == "content":
                trained_from[-1] = (trained_from[-1][0], len(ids))
            ids += self._ids(text)
        trained = [False] * len(ids)
        for first, content in trained_from:  # up to its turn's end-of-turn token
            turn_end = next((k for k in range(content, len(ids)) if ids[k] in self.special),
                            len(ids) - 1)
            trained[first:turn_end + 1] = [True] * (turn_end + 1 - first)
        return ids, trained

    def _pieces(self, messages: list[dict]) -> list[tuple[str, str]]:
        """The conversation as (text, kind) pieces: "context" (the template's text before an
        assistant turn and between turns), "turn" (what the template generates before a
        turn's content: Qwen3's `<think>` block, else nothing), "content". Where the template
        renders earlier turns as a prefix of the whole conversation (Qwen2.5, Llama 3, Gemma,
        Phi) this is exactly its rendering; where it drops a history turn's reasoning (Qwen3,
        Qwen3.5) each turn keeps the form it was generated in, as TRL's training templates
        render it (trl/chat_templates/qwen3_training.jinja: the thinking block always)."""
        pieces: list[tuple[str, str]] = []
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        for n, i in enumerate(turns):
            alone = self._text([*messages[:i], {**messages[i], "content": _CONTENT}])
            # A turn with reasoning was generated in thinking mode (Qwen3.5's small models
            # default to the other); an assistant-first chat has no generation prompt: its turn
            # starts at the content (a default system prompt before it stays untrained).
            mode = {"enable_thinking": True} if "reasoning_content" in messages[i] else {}
            prompt = self._text(messages[:i], add_generation_prompt=True, **mode) if i else \
                alone.partition(_CONTENT)[0]
            if n:  # from the previous content's end, as the template renders it in history
                j = turns[n - 1]
                held = self._text([*messages[:j], {**messages[j], "content": _CONTENT},
                                   *messages[j + 1:i]], add_generation_prompt=True, **mode)
                prefix = held.replace(_CONTENT, messages[j]["content"], 1) == prompt
                pieces.append((held.partition(_CONTENT)[2], "context"))
            else:
                prefix = True
                pieces.append((prompt, "context"))
            if not (prefix and alone.startswith(prompt) and _CONTENT in alone[len(prompt):]):
                raise TokenizeError("the chat template does not render a conversation's first "
                                    "turns as a prefix of the conversation with its next "
                                    "assistant turn, so its assistant tokens cannot be found; "
                                    "use prompt/completion data")
            pieces += [(alone[len(prompt):].partition(_CONTENT)[0], "turn"),
                       (messages[i]["content"], "content")]
        if not turns:
            return pieces + [(self._text(messages), "context")]
        last = turns[-1]
        whole = self._text([*messages[:last], {**messages[last], "content": _CONTENT},
                            *messages[last + 1:]])
        return pieces + [(whole.partition(_CONTENT)[2], "context")]

    def _reasoning_apart(self, messages: Sequence[dict]) -> list[dict]:
        """Where the template reads `reasoning_content` (Qwen3, Qwen3.5), an assistant content
        holding a `<think>...</think>` block is split into that reasoning and the rest, as
        TRL's training templates split it (both tags present); other templates get the content
        as it is (the block is then text of the answer)."""
        if "reasoning_content" not in str(self.tok.chat_template):
            return [dict(m) for m in messages]
        out = []
        for m in messages:
            content = m["content"]
            if m["role"] == "assistant" and not isinstance(m.get("reasoning_content"), str) \
                    and "<think>" in content and "</think>" in content:
                head, _, content = content.rpartition("</think>")
                m = {**m, "reasoning_content": head.rstrip("\n").split("<think>")[-1]
                     .lstrip("\n"), "content": content.lstrip("\n")}
            out.append(dict(m))
        return out

    def _guarded(self, messages: Sequence[dict]) -> list[dict]:
        """The messages with each special token's text in a content replaced by a marker that
        `_ids` reads back as that text, tokenized as text: a typed `<|im_end|>` neither ends nor
        opens a turn (the template's own tokens, rendered outside the contents, stay tokens)."""
        def guard(i: int, text: str) -> str:
            if _GUARD in text:
                raise TokenizeError(f"messages[{i}] holds the private-use character U+E000, "
                                    "which the job reserves; remove it from the content")
            for k, t in sorted(enumerate(self._special_texts), key=lambda kt: -len(kt[1])):
                text = text.replace(t, f"{_GUARD}{k}{_GUARD}")
            return text
        return [{**m, "content": guard(i, m["content"]),
                 **({"reasoning_content": guard(i, m["reasoning_content"])}
                    if isinstance(m.get("reasoning_content"), str) else {})}
                for i, m in enumerate(messages)]


def encoder(name: str) -> Encoder:
    return ByteEncoder() if name == BYTES else HFEncoder(name)


@functools.cache
def hf_tokenizer(name: str):
    """Loaded once per process."""
    from transformers import AutoTokenizer

    from training.model.loading import local_dir

    return AutoTokenizer.from_pretrained(local_dir(name))  # s3://: its files, copied here
