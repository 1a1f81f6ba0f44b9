"""The run's usable result: a Hugging Face model directory written at the end of a run.

`<run directory>/hf_model/` holds what `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` need: safetensors weights in bf16 (`--export-dtype fp32` keeps the
master weights' precision) with the tied LM head stored once (the key `save_pretrained` leaves
out for tied weights), `config.json` (its `dtype` the exported one, `use_cache` back on for
generation), `generation_config.json` (generation stops at the end of a chat turn and at the
tokenizer's EOS) and the tokenizer's files. The built-in `bytes` tokenizer is written as a
byte-level `PreTrainedTokenizerFast` (`bytes_tokenizer`): ids 0-255 are the UTF-8 bytes, 256 is
`<|endoftext|>`, exactly as the job tokenized its text, with a chat template that renders the
job's byte chat format. A built-in shape trained without a tokenizer (random tokens) is exported
without one.

A LoRA run (`--lora-rank`) exports the merged weights there (W + alpha/r * B @ A, merged in fp32,
then cast) and its adapters alone to `<run directory>/hf_adapter/` in PEFT's format.

The directory is replaced as a whole and `COMPLETE` is written last (training/run/run_files.py
`publish`), as checkpoints are: a directory without it is torn or being replaced.
"""

from __future__ import annotations

import copy
import tempfile

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from training.config import TrainConfig
from training.data.tokenize import (BYTES, BYTES_CHAT_TEMPLATE, BYTES_EOS_TEXT, encoder,
                                    hf_tokenizer)
from training.step.engine import Engine
from training.model import lora
from training.model.loading import local_dir
from training.model.model import is_builtin, tied_aliases
from training.run.run_files import RunFiles

EXPORT_DIR, MARKER = "hf_model", "COMPLETE"
ADAPTER_DIR = "hf_adapter"  # LoRA runs: the adapters alone (training/model/lora.py)
BASE_DIR = "hf_base"  # LoRA on a built-in shape: its random-init base, the adapter's base
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
EOS = BYTES_EOS_TEXT


def bytes_tokenizer():
    """The built-in `bytes` tokenizer as a Hugging Face fast tokenizer: a byte-level BPE without
    merges, so every UTF-8 byte is one token whose id is the byte's value, and EOS is 256; its
    chat template renders the job's byte chat format (tokenize.BYTES_CHAT_TEMPLATE)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {char: byte for byte, char in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   chat_template=BYTES_CHAT_TEMPLATE)


def _tokenizer_name(cfg: TrainConfig) -> str | None:
    """The tokenizer the run trained with, or None (a built-in shape on random tokens)."""
    return cfg.tokenizer or (None if is_builtin(cfg.model) else cfg.model)


def tokenizer_for(cfg: TrainConfig):
    name = _tokenizer_name(cfg)
    if name is None:
        return None
    return bytes_tokenizer() if name == BYTES else hf_tokenizer(name)


# transformers 5 saves its tokenizers.Tokenizer-backed class under this name (tokenization_utils_
# base.py `save_pretrained`: `self.__class__.__name__`); transformers 4.x has no such class and
# AutoTokenizer fails with "Tokenizer class TokenizersBackend does not exist".
V5_ONLY_CLASS, PORTABLE_CLASS = "TokenizersBackend", "PreTrainedTokenizerFast"


def portable_tokenizer_config(directory: str, source: str, inputs: list[str] | None = None) -> None:
    """Make `directory`'s tokenizer_config.json say, for transformers 4.x as for 5, which class
    to load and which inputs the model takes. The class: the source tokenizer's own
    (Qwen2Tokenizer for Qwen2.5; both versions map it to their tokenizer.json-backed class), else
    PreTrainedTokenizerFast (the built-in bytes tokenizer, a source that names none), which 5
    keeps as an alias of TokenizersBackend. The inputs (`model_input_names`): 4.57's
    PreTrainedTokenizerFast returns `token_type_ids` unless told otherwise, and `generate` then
    refuses them ("model_kwargs are not used by the model")."""
    import json
    from pathlib import Path

    path = Path(directory, "tokenizer_config.json")
    written = json.loads(path.read_text())
    if inputs is not None:
        written["model_input_names"] = inputs
    if written.get("tokenizer_class") == V5_ONLY_CLASS:
        own = None if source == BYTES else _source_tokenizer_class(source)
        written["tokenizer_class"] = own if own and own != V5_ONLY_CLASS else PORTABLE_CLASS
    path.write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n")


def model_inputs(lm, tokenizer) -> list[str]:
    """The tokenizer's outputs that the model's forward takes by name (a causal LM: input_ids
    and attention_mask, never token_type_ids)."""
    import inspect

    accepted = inspect.signature(lm.forward).parameters
    return [name for name in tokenizer.model_input_names if name in accepted]


def _source_tokenizer_class(source: str) -> str | None:
    from transformers.models.auto.tokenization_auto import get_tokenizer_config

    try:
        return get_tokenizer_config(local_dir(source)).get("tokenizer_class")
    except OSError:
        return None


def _generation_config(cfg: TrainConfig, config, tokenizer):
    """The source model's generation config when it has one, else one from the model config.
    Generation stops at the chat template's end of turn (`<|im_end|>` for Qwen2.5, also under
    the base model's EOS `<|endoftext|>`: every trained turn ends there), the tokenizer's EOS
    and whatever the source stopped at; padding is the tokenizer's, else the first of those."""
    from transformers import GenerationConfig

    gen = None
    if not is_builtin(cfg.model):
        try:
            gen = GenerationConfig.from_pretrained(local_dir(cfg.model))
        except OSError:  # the source has no generation_config.json
            pass
    gen = gen or GenerationConfig.from_model_config(config)
    gen.use_cache = True  # generation wants its KV cache, whatever a source saved with it said
    if tokenizer is not None:
        source = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
        ids = [encoder(_tokenizer_name(cfg)).end_of_turn(), tokenizer.eos_token_id, *source]
        stop = list(dict.fromkeys(i for i in ids if i is not None))
        gen.eos_token_id = stop[0] if len(stop) == 1 else stop or None
        if gen.pad_token_id is None:
            gen.pad_token_id = tokenizer.pad_token_id
    if gen.pad_token_id is None:
        eos = gen.eos_token_id
        gen.pad_token_id = eos[0] if isinstance(eos, list) else eos
    return gen


def export(engine: Engine, cfg: TrainConfig, files: RunFiles | None) -> str | None:
    """Collective (the full state dict is gathered to rank 0's host); rank 0 writes the directory.
    Returns its path on rank 0, None elsewhere."""
    full = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True,
                                                                       cpu_offload=True))
    if files is None:
        return None
    dtype = DTYPES[cfg.export_dtype]
    aliases = tied_aliases(engine.model)
    full = {k.removeprefix("lm."): v for k, v in full.items() if k not in aliases}
    if engine.lora is not None:  # the adapters as PEFT writes them, and the merged model
        _export_adapter(engine.lora, full, cfg, files, engine.model.lm)
        full = lora.merged_state(full, engine.lora, dtype)  # merged in fp32, cast per tensor
    state = {k: v.to(dtype) for k, v in full.items()}
    del full
    with tempfile.TemporaryDirectory(prefix="export-") as d:
        write_model_dir(d, engine.model.lm, state, cfg)
        files.publish(d, EXPORT_DIR, MARKER)
    return files.uri(EXPORT_DIR)


def write_model_dir(directory: str, lm, state: dict, cfg: TrainConfig) -> None:
    """The Hugging Face directory of `lm` with the weights `state` (already in the export dtype)
    and the run's tokenizer, loadable by transformers 5 and 4.x."""
    config = copy.deepcopy(lm.config)
    config.dtype = DTYPES[cfg.export_dtype]
    config.use_cache = True  # training runs without a KV cache
    tokenizer = tokenizer_for(cfg)
    lm.save_pretrained(directory, state_dict=state)
    config.save_pretrained(directory)  # over the training config save_pretrained wrote
    _generation_config(cfg, config, tokenizer).save_pretrained(directory)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
        portable_tokenizer_config(directory, _tokenizer_name(cfg), model_inputs(lm, tokenizer))


def _export_adapter(spec: lora.LoraSpec, full: dict, cfg: TrainConfig, files: RunFiles,
                    lm) -> None:
    """`<run directory>/hf_adapter/`: the fp32 adapters in PEFT's format, for
    `PeftModel.from_pretrained(<the base --model>, path)`; COMPLETE last, as the model's. A
    built-in shape's base exists nowhere else (its random init from --seed): it is written to
    `<run directory>/hf_base/`, which the adapter's `base_model_name_or_path` names."""
    base_name = None if is_builtin(cfg.model) else cfg.model
    if is_builtin(cfg.model):
        untrained = {k: torch.zeros_like(v) if lora.is_adapter(k) else v for k, v in full.items()}
        dtype = DTYPES[cfg.export_dtype]
        state = {k: v.to(dtype) for k, v in lora.merged_state(untrained, spec, dtype).items()}
        with tempfile.TemporaryDirectory(prefix="export-base-") as d:
            write_model_dir(d, lm, state, cfg)
            files.publish(d, BASE_DIR, MARKER)
        base_name = files.uri(BASE_DIR)
    with tempfile.TemporaryDirectory(prefix="export-adapter-") as d:
        lora.write_adapter(d, lora.adapter_state(full, torch.float32), spec, base_name)
        files.publish(d, ADAPTER_DIR, MARKER)
