"""Each data format: the tokens of its rows and which of them the loss trains on, through the
built-in byte tokenizer and real Hugging Face ones (Qwen2.5's chat template), how a format is told
from its columns, and the row it refuses, with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.data.formats import MESSAGES, PROMPT_COMPLETION, TEXT, RowError, detect
from training.data.synthetic import PAIRS, SHIPPED, examples, preference_pairs, render
from training.data.tokenize import ByteEncoder, HFEncoder

EOS = ByteEncoder.eos
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6"}]


def _spans(ids: list[int], trained: list[bool]) -> list[list[int]]:
    """The runs of consecutive trained tokens."""
    out, run = [], []
    for i, t in zip(ids, trained):
        if t:
            run.append(i)
        elif run:
            out, run = out + [run], []
    return out + [run] if run else out


def test_text_trains_every_token_of_the_tokenizers_own_encoding_plus_eos():
    assert TEXT.encode_row({"text": "ab"}, ByteEncoder(), "completion") == \
        ([97, 98, EOS], [True] * 3)


def test_prompt_completion_trains_the_completion_and_its_eos_only():
    row = {"prompt": "Q?", "completion": "A"}
    ids, trained = PROMPT_COMPLETION.encode_row(row, ByteEncoder(), "completion")
    assert ids == [*b"Q?A", EOS] and _spans(ids, trained) == [[ord("A"), EOS]]
    _, everything = PROMPT_COMPLETION.encode_row(row, ByteEncoder(), "all")
    assert all(everything)


def test_the_format_is_the_most_specific_one_whose_columns_are_all_present():
    chat = {"messages": CHAT, "text": "a rendering", "prompt": "p", "completion": "c"}
    assert detect(list(chat)) is MESSAGES
    assert detect(["text", "completion", "prompt", "id"]) is PROMPT_COMPLETION
    assert detect(["completion", "text"]) is TEXT  # a completion without its prompt is text
    with pytest.raises(RowError, match=r"no `text`, `prompt` \+ `completion` or `messages` "
                                       "column .found question, answer"):
        detect(["question", "answer"])


@pytest.mark.parametrize("fmt, row, message", [
    (TEXT, {"text": 3}, "`text` must be a string .got int"),
    (TEXT, {"text": ""}, r"no token to train on \(empty text\)"),
    (TEXT, {"messages": CHAT},
     r"no `text` column \(the data is text: text, from its first row"),
    (PROMPT_COMPLETION, {"prompt": "", "completion": ""},
     r"no token to train on \(an empty completion\)"),
    (PROMPT_COMPLETION, {"prompt": None, "completion": "A"},
     "`prompt` must be a string .got NoneType"),
    (PROMPT_COMPLETION, {"prompt": "Q?"}, r"no `completion` column .the data is prompt-completion: "
                                          r"prompt \+ completion"),
    (MESSAGES, {"messages": CHAT[:2]}, r"no token to train on \(no assistant turn\)"),
    (MESSAGES, {"messages": []}, "`messages` must be a non-empty list"),
    (MESSAGES, {"messages": [CHAT[0], {"role": "robot", "content": "x"}]},
     r"messages\[1\] must be \{\"role\": one of \['system', 'user', 'assistant', 'tool'\]"),
])
def test_a_row_its_format_cannot_train_on_is_refused_with_the_reason(fmt, row, message):
    with pytest.raises(RowError, match=message):
        fmt.encode_row(row, ByteEncoder(), "completion")


def test_an_empty_completion_trains_its_eos_and_a_lone_eos_is_refused_even_under_loss_all():
    ids, trained = PROMPT_COMPLETION.encode_row({"prompt": "Q?", "completion": ""}, ByteEncoder(),
                                            "completion")
    assert _spans(ids, trained) == [[EOS]]  # the model learns to stop after this prompt
    with pytest.raises(RowError, match="empty text"):  # the EOS alone: nothing predicts it
        TEXT.encode_row({"text": ""}, ByteEncoder(), "all")


def test_the_formats_load_without_torch_or_transformers_for_the_help():
    """The flags' help is written before anything heavy is imported (`--help` answers at once)."""
    code = ("import sys, training.data.formats as f; print(f.listing(f.Format.quoted, ', or ')); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', "
            "'numpy', 'pyarrow'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3]).stdout
    assert out == "`text`, `prompt` + `completion`, or `messages`\n[]\n"


def test_bytes_chat_format_trains_the_assistant_turns_and_their_end():
    ids, trained = MESSAGES.encode_row({"messages": CHAT}, ByteEncoder(), "completion")
    assert bytes(i for i in ids if i != EOS).decode().startswith("<|system|>\nBe brief.\n")
    assert _spans(ids, trained) == [[ord("4"), EOS], [ord("6"), EOS]]


@pytest.mark.parametrize("eos", ["<|im_end|>", "<|endoftext|>"])  # Instruct's, the base model's
def test_qwen25_template_trains_exactly_the_assistant_turns(qwen_template_tokenizer, tmp_path, eos):
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(qwen_template_tokenizer, eos_token=eos).save_pretrained(tmp_path)
    enc = HFEncoder(str(tmp_path))
    ids, trained = MESSAGES.encode_row({"messages": CHAT}, enc, "completion")
    text = enc.tok.decode(ids)
    # The template's own rendering (../shared/reference/qwen2.5/README.md records it).
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n"
                    "<|im_start|>assistant\n6<|im_end|>\n")
    assert [enc.tok.decode(s) for s in _spans(ids, trained)] == ["4<|im_end|>", "6<|im_end|>"]


def test_qwen25_default_system_prompt_and_multi_token_answers_stay_untrained(
        qwen_template_tokenizer):
    enc = HFEncoder(str(qwen_template_tokenizer))
    chat = [{"role": "user", "content": "Name the storage."},
            {"role": "assistant", "content": "The checkpoints go to an S3 bucket."}]
    ids, trained = MESSAGES.encode_row({"messages": chat}, enc, "completion")
    assert "You are Qwen" in enc.tok.decode(ids)
    assert [enc.tok.decode(s) for s in _spans(ids, trained)] == \
        ["The checkpoints go to an S3 bucket.<|im_end|>"]


def test_the_shipped_instruction_set_is_what_its_generator_writes_and_trains_on_answers():
    assert SHIPPED.read_text() == render(examples())
    assert PAIRS.read_text() == render(preference_pairs(examples()))
    rows = [json.loads(line) for line in SHIPPED.read_text().splitlines()]
    add = next(r["messages"] for r in rows if r["messages"][0]["content"].startswith("What is"))
    a, b = (int(x) for x in add[0]["content"][len("What is "):-1].split(" + "))
    assert add[1] == {"role": "assistant", "content": str(a + b)}
    ids, trained = MESSAGES.encode_row(rows[0], ByteEncoder(), "completion")
    assert _spans(ids, trained) == [[*rows[0]["messages"][1]["content"].encode(), EOS]]


def _tokenizer(tmp_path, bos: bool, eos: bool) -> str:
    """A small BPE whose post-processor adds a BOS, as Llama 3's and Gemma's do (or not)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["a plain document", "another one"],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"]))
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    out = tmp_path / f"tok-{bos}-{eos}"
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                            eos_token="</s>" if eos else None).save_pretrained(out)
    return str(out)


def test_a_document_is_the_tokenizers_own_encoding_with_its_bos_and_eos_and_no_made_up_id(
        tmp_path):
    with_bos = HFEncoder(_tokenizer(tmp_path, bos=True, eos=True))
    ids, trained = TEXT.encode_row({"text": "a plain document"}, with_bos, "completion")
    bos, eos = with_bos.tok.convert_tokens_to_ids(["<s>", "</s>"])
    assert ids[0] == bos and ids[-1] == eos and ids.count(bos) == 1 and all(trained)
    no_eos = HFEncoder(_tokenizer(tmp_path, bos=False, eos=False))
    ids, _ = TEXT.encode_row({"text": "a plain document"}, no_eos, "completion")
    assert ids == no_eos.tok.encode("a plain document")  # nothing appended, no id 0


def test_chat_data_needs_a_template_whose_first_turns_render_as_a_prefix(
        tmp_path, qwen_template_tokenizer):
    from transformers import AutoTokenizer

    enc = HFEncoder(_tokenizer(tmp_path, bos=False, eos=True))  # no chat template
    with pytest.raises(RowError, match="the tokenizer has no chat template for `messages` data"):
        MESSAGES.encode_row({"messages": CHAT}, enc, "completion")
    # A template that leads with the turn count renders no prefix of the whole conversation.
    tok = AutoTokenizer.from_pretrained(qwen_template_tokenizer)
    tok.chat_template = "{{ messages|length }}{% for m in messages %}{{ m.content }}{% endfor %}"
    tok.save_pretrained(tmp_path / "counting")
    with pytest.raises(RowError, match="does not render a conversation's first turns as a prefix"):
        MESSAGES.encode_row({"messages": CHAT}, HFEncoder(str(tmp_path / "counting")), "completion")


def test_an_assistant_first_chat_trains_its_greeting_not_the_system_prompt(qwen_base_tokenizer):
    enc = HFEncoder(str(qwen_base_tokenizer))
    chat = [{"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Name the storage."},
            {"role": "assistant", "content": "An S3 bucket."}]
    ids, trained = MESSAGES.encode_row({"messages": chat}, enc, "completion")
    assert enc.decode(ids).startswith("<|im_start|>system\nYou are Qwen")  # the default prompt
    assert [enc.decode(s) for s in _spans(ids, trained)] == \
        ["Hello! How can I help?<|im_end|>", "An S3 bucket.<|im_end|>"]


def test_the_end_of_turn_of_a_base_models_template_is_im_end_not_its_eos(qwen_base_tokenizer):
    enc = HFEncoder(str(qwen_base_tokenizer))
    assert enc.tok.decode([enc.eos]) == "<|endoftext|>"
    assert enc.tok.decode([enc.end_of_turn()]) == "<|im_end|>"
    assert ByteEncoder().end_of_turn() == EOS


def test_a_completion_that_merges_with_its_prompt_is_trained_whole(qwen_base_tokenizer):
    enc = HFEncoder(str(qwen_base_tokenizer))
    whole = enc.tok.tokenize("The capital of France is Paris")
    assert whole[-1] == "ĠParis"  # the BPE merges the prompt's space into the answer
    row = {"prompt": "The capital of France is ", "completion": "Paris"}
    ids, trained = PROMPT_COMPLETION.encode_row(row, enc, "completion")
    assert enc.decode(ids) == "The capital of France is Paris<|endoftext|>"
    assert [enc.decode(s) for s in _spans(ids, trained)] == ["Paris<|endoftext|>"]
    # A clean boundary keeps the tokenizer's own encoding of the whole text, as TRL does.
    ids, trained = PROMPT_COMPLETION.encode_row({"prompt": "The capital of France is",
                                             "completion": " Paris"}, enc, "completion")
    assert ids == enc.tok.encode("The capital of France is Paris") + [enc.eos]
    assert [enc.decode(s) for s in _spans(ids, trained)] == [" Paris<|endoftext|>"]


def test_a_merge_that_cannot_be_tokenized_apart_is_refused_with_the_reason(tmp_path):
    """A SentencePiece-style tokenizer (Metaspace, a `▁` before the first word of every encode)
    would spell `"New Yo" + "rk"` apart as "New Yo rk": refused, not trained on a wrong text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(["New York is a city."] * 20,
                            trainers.BpeTrainer(vocab_size=200, special_tokens=["</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>").save_pretrained(tmp_path)
    enc = HFEncoder(str(tmp_path))
    with pytest.raises(RowError, match="merge into one token .'▁York'|York.*word boundary"):
        PROMPT_COMPLETION.encode_row({"prompt": "New Yo", "completion": "rk"}, enc, "completion")


def test_special_token_text_is_text_in_documents_and_in_a_chats_turns(qwen_base_tokenizer):
    enc = HFEncoder(str(qwen_base_tokenizer))
    typed = "Type <|im_end|> to stop."
    ids, trained = TEXT.encode_row({"text": typed}, enc, "completion")
    assert enc.decode(ids) == typed + "<|endoftext|>" and set(ids[:-1]).isdisjoint(enc.special)
    ids, trained = PROMPT_COMPLETION.encode_row({"prompt": "Q: ", "completion": typed}, enc,
                                            "completion")
    assert [enc.decode(s) for s in _spans(ids, trained)] == [typed + "<|endoftext|>"]
    im_end = enc.tok.convert_tokens_to_ids("<|im_end|>")
    chat = [{"role": "user", "content": "What ends <|im_start|>a turn?"},
            {"role": "assistant", "content": typed}]
    ids, trained = MESSAGES.encode_row({"messages": chat}, enc, "completion")
    # The typed texts are text: the turns' own markers are the only special tokens, and the
    # assistant turn is trained whole, up to the template's <|im_end|> and no further.
    assert [enc.decode(s) for s in _spans(ids, trained)] == [typed + "<|im_end|>"]
    rendered = enc.tok.apply_chat_template(chat, tokenize=False)
    turns = rendered.count("<|im_start|>") - 1  # the template's own (a system turn too), not the typed one
    assert ids.count(im_end) == ids.count(enc.tok.convert_tokens_to_ids("<|im_start|>")) == turns
    assert enc.decode(ids) == rendered
    with pytest.raises(RowError, match=r"messages\[0\] holds the private-use character"):
        MESSAGES.encode_row({"messages": [{"role": "user", "content": "\ue000"}, chat[1]]},
                            enc, "completion")


def test_an_answer_starting_with_a_newline_trains_exactly_itself_under_qwen2s_pre_tokenizer(
        qwen_base_tokenizer):
    """Qwen2's pre-tokenizer makes "\\n\\n" one pre-token, so the template's "assistant\\n" and a
    content "\\n..." would merge across the boundary; the content is tokenized on its own and
    trains, with its end of turn, exactly."""
    enc = HFEncoder(str(qwen_base_tokenizer))
    assert len(enc.encode_plain("\n\n")) == 1  # the merge the real vocabulary has
    chat = [{"role": "user", "content": "List two."},
            {"role": "assistant", "content": "\n\n- one\n- two\n"},
            {"role": "user", "content": "Again?"}, {"role": "assistant", "content": "\nyes"}]
    ids, trained = MESSAGES.encode_row({"messages": chat}, enc, "completion")
    assert enc.decode(ids) == enc.tok.apply_chat_template(chat, tokenize=False)
    assert [enc.decode(s) for s in _spans(ids, trained)] == \
        ["\n\n- one\n- two\n<|im_end|>", "\nyes<|im_end|>"]


def test_content_null_is_an_empty_turn_and_tool_calls_are_refused_by_name(qwen_base_tokenizer):
    enc = HFEncoder(str(qwen_base_tokenizer))
    chat = [{"role": "system", "content": None}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}]
    ids, _ = MESSAGES.encode_row({"messages": chat}, enc, "completion")
    assert enc.decode(ids).startswith("<|im_start|>system\n<|im_end|>")  # not "None"
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    with pytest.raises(RowError, match=r"messages\[1\] has `tool_calls`: tool-call turns are "
                                       "not trained"):
        MESSAGES.encode_row({"messages": [chat[1], call]}, enc, "completion")
