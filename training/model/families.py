"""The model families the job is built and tested for: one table (family, transformers
architecture, LoRA targets, chat-template handling, packing), and the driver's refusal of
anything outside it before Ray starts and before a GPU is requested.

Standard library only: the check reads a config's `model_type`, `architectures` and a few
attributes, whether a transformers `PretrainedConfig` or a `config.json` read as a dict, so it
runs where torch is not imported. What each row claims is tested on a tiny random config of that
architecture (tests/training/model/test_families.py, tests/training/data/test_chat_families.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from training.errors import InputError

ATTENTION_MLP = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Template handling (docs/models.md says what each means).
PREFIX = "prefix"  # earlier turns render the same in a longer chat: spans found in place
GENERATION_FORM = "generation form"  # history turns drop reasoning: each turn as generated


@dataclass(frozen=True)
class Family:
    """One row of the supported-models table."""
    name: str  # as docs/models.md names it
    model_types: tuple[str, ...]  # config.json `model_type` values of this family
    architecture: str  # the transformers class the job builds (AutoModelForCausalLM)
    lora_targets: tuple[str, ...]  # --lora-target-modules by default
    template: str  # PREFIX or GENERATION_FORM
    packing: bool  # packed rows keep documents apart in every layer type
    layer_types: str  # what attention the layers mix, for the table
    examples: str  # checkpoints of this family

    @property
    def limit(self) -> str | None:
        """What a run of this family cannot do correctly yet (then refused unless
        --allow-untested-architecture), or None."""
        if not self.packing:
            return ("its linear-attention layers carry a recurrent state across packed "
                    "documents (transformers resets it only with the flash-linear-attention "
                    "kernels' cu_seqlens, which the job's image lacks), so neighbouring "
                    "documents leak into each other")
        return None


FAMILIES: tuple[Family, ...] = (
    Family("Qwen2 / Qwen2.5", ("qwen2",), "Qwen2ForCausalLM", ATTENTION_MLP, PREFIX, True,
           "full attention", "Qwen/Qwen2.5-1.5B, Qwen/Qwen2.5-7B-Instruct"),
    Family("Qwen3", ("qwen3",), "Qwen3ForCausalLM", ATTENTION_MLP, GENERATION_FORM, True,
           "full attention (QK-norm)", "Qwen/Qwen3-8B, Qwen/Qwen3-4B-Instruct-2507"),
    Family("Qwen3.5 (text)", ("qwen3_5_text",), "Qwen3_5ForCausalLM",
           ATTENTION_MLP + ("in_proj_qkv", "in_proj_z", "out_proj"), GENERATION_FORM, False,
           "3 Gated DeltaNet (linear) : 1 full attention", "a Qwen3.5 text-only export"),
    Family("Llama 3.x / SmolLM2", ("llama",), "LlamaForCausalLM", ATTENTION_MLP, PREFIX, True,
           "full attention", "meta-llama/Llama-3.1-8B-Instruct, meta-llama/Llama-3.2-3B"),
    Family("Mistral / Ministral", ("mistral", "ministral"), "MistralForCausalLM",
           ATTENTION_MLP, PREFIX, True, "full or sliding-window attention",
           "mistralai/Mistral-7B-Instruct-v0.3, mistralai/Ministral-8B-Instruct-2410"),
    Family("Gemma 3 (text)", ("gemma3_text",), "Gemma3ForCausalLM", ATTENTION_MLP, PREFIX, True,
           "5 sliding-window : 1 full attention", "google/gemma-3-1b-it"),
    Family("Phi-3 / Phi-4-mini", ("phi3",), "Phi3ForCausalLM",
           ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), PREFIX, True,
           "full attention, fused QKV and gate/up", "microsoft/Phi-4-mini-instruct"),
    Family("OLMo 2 / OLMo 3", ("olmo2", "olmo3"), "Olmo2ForCausalLM, Olmo3ForCausalLM", ATTENTION_MLP, PREFIX,
           True, "OLMo 3: 3 sliding-window : 1 full attention", "allenai/Olmo-3-7B-Instruct"),
    Family("SmolLM3", ("smollm3",), "SmolLM3ForCausalLM", ATTENTION_MLP, PREFIX, True,
           "full attention, every 4th layer without RoPE", "HuggingFaceTB/SmolLM3-3B"),
)
BY_MODEL_TYPE = {t: f for f in FAMILIES for t in f.model_types}
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_MULTIMODAL = ("vision_config", "audio_config", "text_config")


class ArchitectureError(InputError):
    """A model outside the supported families (or one the job would train wrongly)."""


def supported() -> str:
    """The table's families in one phrase, for the refusals."""
    return "; ".join(f"{f.name} ({f.architecture})" for f in FAMILIES)


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def _named(config: Any) -> str:
    arch = _get(config, "architectures") or []
    return f"{', '.join(arch) or 'no architectures'} (model_type {_get(config, 'model_type')!r})"


def _wrong(config: Any) -> str | None:
    """Why the job would train this config wrongly whatever the flags say, or None."""
    if _get(config, "final_logit_softcapping"):
        return ("its logits are soft-capped (final_logit_softcapping), which the fused loss "
                "does not apply: the loss and the gradients would be the wrong ones")
    return None


def _outside(config: Any) -> str | None:
    """Why this config is outside the table, or None when it is a supported family."""
    model_type = _get(config, "model_type") or ""
    arch = " ".join(_get(config, "architectures") or [])
    if any(_get(config, k) for k in _MULTIMODAL) or "ForConditionalGeneration" in arch:
        return "a multimodal model (the job trains text decoders only)"
    if "moe" in model_type or any(_get(config, k) for k in _EXPERTS):
        return ("a mixture-of-experts model (FSDP2 per decoder layer gathers every expert, and "
                "the planner and LoRA targets assume dense MLPs)")
    if model_type not in BY_MODEL_TYPE:
        return "an architecture the job has not been tested with"
    return None


def check(config: Any, allow_untested: bool = False) -> tuple[Family | None, str | None]:
    """(the config's family or None, a line stating a run's limits or None). A model outside
    the table, or a family with a known limit, is an ArchitectureError naming its architecture
    and the supported list, unless `allow_untested` (--allow-untested-architecture), when the
    returned line states what is untested; a model the job would train wrongly is refused
    always."""
    wrong = _wrong(config)
    if wrong:
        raise ArchitectureError(f"--model {_named(config)}: refused: {wrong}")
    family, outside = BY_MODEL_TYPE.get(_get(config, "model_type") or ""), _outside(config)
    if outside:
        where = f"--model {_named(config)} is {outside}"
    elif family.limit:
        where = f"--model {_named(config)} ({family.name}): {family.limit}"
    else:
        return family, None
    if not allow_untested:
        raise ArchitectureError(f"{where}. Supported: {supported()}. "
                                "--allow-untested-architecture trains it anyway, untested")
    return family, (f"untested architecture: {where}; training it anyway "
                    "(--allow-untested-architecture): chat spans, packing isolation, LoRA "
                    "targets and the memory plan are not verified for it")


def lora_targets(config: Any) -> tuple[str, ...] | None:
    """The family's default LoRA targets, or None outside the table."""
    family = BY_MODEL_TYPE.get(_get(config, "model_type") or "")
    return family.lora_targets if family else None
