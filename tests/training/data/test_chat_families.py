"""Chat spans with each family's real chat template, against TRL's SFT as the reference: TRL
1.16.0 ships the templates (trl/chat_templates/, read from the installed package, never copied
here) and `get_training_chat_template` swaps in its `{% generation %}` variant, whose
`return_assistant_tokens_mask` is what its SFTTrainer trains with `assistant_only_loss=True`
(trl/trainer/sft_trainer.py: `_tokenize(..., return_assistant_tokens_mask=...)`). Our spans
are the same tokens, but for the newline TRL's masks take after an end-of-turn token."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from training.config import TrainConfig
from training.data.formats import MESSAGES
from training.data.tokenize import HFEncoder
from training.data.preview import spans

# family: (TRL template, special tokens, added tokens that are not special, bos, eos)
QWEN = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
FAMILIES = {
    "llama3": ("llama3", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                          "<|eot_id|>"], [], "<|begin_of_text|>", "<|eot_id|>"),
    "llama3_1": ("llama3_1", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                              "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"], [],
                 "<|begin_of_text|>", "<|eot_id|>"),
    "llama3_2": ("llama3_2", ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                              "<|eot_id|>"], [], "<|begin_of_text|>", "<|eot_id|>"),
    "gemma3": ("gemma3", ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], [], "<bos>",
               "<eos>"),
    "phi3_5": ("phi3_5", ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>",
                          "<|end|>"], [], None, "<|endoftext|>"),
    "qwen2_5": ("qwen2_5", QWEN, QWEN_ADDED, None, "<|im_end|>"),
    "qwen3": ("qwen3", QWEN, QWEN_ADDED, None, "<|im_end|>"),
    "qwen3_5_think": ("qwen3_5_think", QWEN, QWEN_ADDED, None, "<|im_end|>"),
    "qwen3_5_nothink": ("qwen3_5_nothink", QWEN, QWEN_ADDED, None, "<|im_end|>"),
    "qwen3_6": ("qwen3_6", QWEN, QWEN_ADDED, None, "<|im_end|>"),
}
NO_TRL_TRAINING_TEMPLATE = {"llama3_1", "llama3_2"}  # TRL 1.16.0 patches Llama 3's only
REASONING = {"qwen3", "qwen3_5_think", "qwen3_5_nothink", "qwen3_6"}
CHATS = {
    "system, two turns": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "It is 4."},
        {"role": "user", "content": "And 3 + 3?"},
        {"role": "assistant", "content": "It is 6, as the storage said."}],
    "three turns, no system": [
        {"role": "user", "content": "Name the storage."},
        {"role": "assistant", "content": "An S3 bucket."},
        {"role": "user", "content": "Which Region?"},
        {"role": "assistant", "content": "The stack's Region."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "You are welcome."}],
}
THINKING = [  # reasoning as a field, as a <think> block in the content, and none
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "It is 4.", "reasoning_content": "Two and two."},
    {"role": "user", "content": "And 3 + 3?"},
    {"role": "assistant", "content": "<think>\nThree and three.\n</think>\n\nIt is 6."},
    {"role": "user", "content": "Thanks."},
    {"role": "assistant", "content": "You are welcome."}]


def _templates() -> Path:
    trl = pytest.importorskip("trl")
    return Path(trl.__file__).parent / "chat_templates"


@pytest.fixture(scope="module")
def family_tokenizers(tmp_path_factory):
    """A small byte-level BPE per family with its special tokens and its real template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = (REPO / "training/data/sample_data/tiny_corpus.jsonl").read_text().splitlines()
    out = {}
    for name, (template, specials, added, bos, eos) in FAMILIES.items():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(corpus, trainers.BpeTrainer(
            vocab_size=500, special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token=bos, eos_token=eos,
            chat_template=(_templates() / f"{template}.jinja").read_text())
        fast.save_pretrained(path := tmp_path_factory.mktemp(name))
        out[name] = str(path)
    return out


def _trl(family: str, messages: list[dict]) -> tuple[list[int], list[list[int]]]:
    """What TRL's SFTTrainer tokenizes and trains for this row with assistant_only_loss; for
    Llama 3.1/3.2, whose templates TRL cannot patch, the template's own rendering and each
    assistant content with its `<|eot_id|>`."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template
    from trl.data_utils import _tokenize

    tok = AutoTokenizer.from_pretrained(family)
    if Path(family).name.startswith(("llama3_1", "llama3_2")):
        ids = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        return ids, [tok.encode(m["content"] + "<|eot_id|>", add_special_tokens=False)
                     for m in messages if m["role"] == "assistant"]
    out = _tokenize(tok, messages, return_assistant_tokens_mask=True,
                    chat_template=get_training_chat_template(tok))
    return out["input_ids"], spans(out["input_ids"], out["assistant_masks"])


def _check_against_trl(path: str, messages: list[dict]) -> list[str]:
    """Our row is TRL's token for token, and each of our trained spans is TRL's but for what
    TRL's masks add around what the model generates: at the start, the end of the generation
    prompt (Qwen2.5's header newline, Qwen3.5's opening `<think>\n`: the prompt holds them),
    at the end, the newline after the end-of-turn token (and Phi-3.5's closing
    `<|endoftext|>` after the last turn)."""
    enc = HFEncoder(path)
    ids, trained = MESSAGES.encode_row({"messages": messages}, enc, "completion")
    trl_ids, trl_spans = _trl(path, messages)
    assert ids == trl_ids, (enc.decode(ids), enc.decode(trl_ids))
    ours = [enc.decode(s) for s in spans(ids, trained)]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(ours) == len(trl_spans) == len(turns)
    for span, trl_span, i in zip(ours, trl_spans, turns):
        thinking = "reasoning_content" in messages[i] or "</think>" in messages[i]["content"]
        mode = {"enable_thinking": True} if thinking else {}
        prompt = enc.tok.apply_chat_template(messages[:i], add_generation_prompt=True,
                                             tokenize=False, **mode)
        lead, found, trail = enc.decode(trl_span).partition(span)
        assert found and prompt.endswith(lead), (span, enc.decode(trl_span))
        assert re.fullmatch(r"\n?(<\|endoftext\|>)?", trail), trail
        assert enc.decode(enc.tok.encode(span)[-1:]) in enc.special.values()
    return ours


@pytest.mark.parametrize("chat", list(CHATS))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_assistant_spans_are_trls_with_each_familys_real_template(family_tokenizers, family,
                                                                 chat):
    ours = _check_against_trl(family_tokenizers[family], CHATS[chat])
    answers = [m["content"] for m in CHATS[chat] if m["role"] == "assistant"]
    assert all(answer in span for answer, span in zip(answers, ours))


@pytest.mark.parametrize("family", sorted(REASONING))
def test_qwen3_reasoning_turns_train_as_trls_sft_trains_them(family_tokenizers, family):
    """Multi-turn Qwen3.x: every assistant turn keeps its thinking block (empty where it had
    none), trained with the answer; a `<think>` block in a content is that turn's reasoning."""
    ours = _check_against_trl(family_tokenizers[family], THINKING)
    assert ours[0].endswith("Two and two.\n</think>\n\nIt is 4.<|im_end|>")
    assert ours[1].endswith("Three and three.\n</think>\n\nIt is 6.<|im_end|>")
    assert ours[2].endswith("You are welcome.<|im_end|>")  # its empty block trained per mode


def test_preview_shows_what_a_qwen3_row_trains_thinking_blocks_included(family_tokenizers,
                                                                        tmp_path):
    import json

    from training.data.preview import preview

    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": THINKING}) + "\n")
    cfg = TrainConfig(model="tiny", data=str(data), tokenizer=family_tokenizers["qwen3"])
    (row,) = preview(cfg, HFEncoder(family_tokenizers["qwen3"]), 1)
    assert row["trained"] == ["<think>\nTwo and two.\n</think>\n\nIt is 4.<|im_end|>",
                              "<think>\nThree and three.\n</think>\n\nIt is 6.<|im_end|>",
                              "<think>\n\n</think>\n\nYou are welcome.<|im_end|>"]
    assert row["text"].startswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n")


@pytest.mark.parametrize("family", ["llama3_1", "gemma3", "phi3_5", "qwen3", "qwen3_5_think"])
def test_the_export_keeps_the_familys_template_and_stops_at_its_end_of_turn(family_tokenizers,
                                                                          family, tmp_path):
    """The exported directory (the job's own writer) holds the family's chat template and a
    generation config that stops at the token each trained turn ends with."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from tests.training.model.tiny_families import tiny_config
    from training.run.export import write_model_dir

    path = family_tokenizers[family]
    enc = HFEncoder(path)
    config = tiny_config("llama")
    config.vocab_size = len(enc.tok)
    lm = AutoModelForCausalLM.from_config(config)
    cfg = TrainConfig(model="tiny", tokenizer=path)
    write_model_dir(str(tmp_path), lm, lm.state_dict(), cfg)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert tok.chat_template == (_templates() / f"{FAMILIES[family][0]}.jinja").read_text()
    stops = GenerationConfig.from_pretrained(tmp_path).eos_token_id
    stops = stops if isinstance(stops, list) else [stops]
    ids, trained = MESSAGES.encode_row({"messages": CHATS["system, two turns"]}, enc,
                                       "completion")
    ends = {ids[k] for k in range(len(ids)) if trained[k] and (k + 1 == len(ids)
                                                               or not trained[k + 1])}
    assert ends <= set(stops), (tok.convert_ids_to_tokens(sorted(ends)), stops)
