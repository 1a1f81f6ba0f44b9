"""The exported model directory loads under transformers 5 (this environment) and 4.x (a separate
virtualenv, TF4_PYTHON, default /tmp/tf457/bin/python, with transformers 4.57 and torch): the
same token ids from AutoTokenizer, the same logits from AutoModelForCausalLM; and
docs/using-the-model.md's snippets run on it as written, on 5 always and on 4.57 where that
virtualenv exists (CI has none: installing a second torch would slow it), with the export's
files checked for what 4.57's classes read instead."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, SHARED
from training.config import TrainConfig
from training.model.model import model_config
from training.run import export

TF4_PYTHON = os.environ.get("TF4_PYTHON", "/tmp/tf457/bin/python")
EOT = "<|endoftext|>"
TEXT = f"<|user|>\nWhat is 2 + 2? é\n<|assistant|>\n4{EOT}"
# Run in the 4.x environment: the ids and logits it reads from the directory, as JSON.
LOAD_IN_4X = """
import json, sys, torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
d, text = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(d)
model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
ids = tok(text)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0, -1].tolist()
print(json.dumps({"version": transformers.__version__, "class": type(tok).__name__,
                  "ids": ids, "logits": logits}))
"""


def _tf4() -> str:
    if not Path(TF4_PYTHON).exists():
        pytest.skip(f"no transformers 4.x environment at {TF4_PYTHON} (set TF4_PYTHON; "
                    "python3 -m venv /tmp/tf457 && /tmp/tf457/bin/pip install "
                    "transformers==4.57.6 torch==2.13.0)")
    return TF4_PYTHON


@pytest.fixture(scope="module")
def bytes_export(tmp_path_factory) -> Path:
    """What the end of `make demo` writes: the `tiny` shape over the bytes tokenizer, bf16."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    cfg = TrainConfig(model="tiny", tokenizer="bytes", num_workers=2, use_gpu=False)
    lm = AutoModelForCausalLM.from_config(model_config("tiny", 257))
    state = {k: v.to(torch.bfloat16) for k, v in lm.state_dict().items()
             if k != "lm_head.weight"}  # tied: stored once, as export() writes it
    out = tmp_path_factory.mktemp("hf_model")
    export.write_model_dir(str(out), lm, state, cfg)
    return out


def _load_here(d: Path) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    ids = tok(TEXT)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    return {"ids": ids, "logits": logits}


def test_the_bytes_export_names_a_tokenizer_class_transformers_4_has(bytes_export):
    written = json.loads((bytes_export / "tokenizer_config.json").read_text())
    assert written["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert _load_here(bytes_export)["ids"] == [*TEXT.removesuffix(EOT).encode(), 256]


def test_a_source_tokenizers_own_class_is_kept(tmp_path, qwen_base_tokenizer):
    """A tokenizer saved as transformers 5's TokenizersBackend gets its source's class back."""
    from transformers import AutoTokenizer

    source = tmp_path / "source"
    AutoTokenizer.from_pretrained(qwen_base_tokenizer).save_pretrained(source)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "Qwen2Tokenizer"  # as Qwen/Qwen2.5-1.5B's names it
    assert json.loads((SHARED / "reference/qwen2.5/tokenizer_config.json").read_text())[
        "tokenizer_class"] == config["tokenizer_class"]
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    AutoTokenizer.from_pretrained(qwen_base_tokenizer).save_pretrained(out)  # TokenizersBackend
    export.portable_tokenizer_config(str(out), str(source))
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "Qwen2Tokenizer"


def test_transformers_4_57_loads_the_export_as_5_does(bytes_export):
    python = _tf4()
    done = subprocess.run([python, "-c", LOAD_IN_4X, str(bytes_export), TEXT],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs["version"].startswith("4.")
    ours = _load_here(bytes_export)
    assert theirs["ids"] == ours["ids"]
    torch.testing.assert_close(torch.tensor(theirs["logits"]), ours["logits"],
                               rtol=1e-4, atol=1e-4)


def snippets() -> list[str]:
    """The `python -c "..."` programs of docs/using-the-model.md, as a reader copies them."""
    text = (REPO / "docs/using-the-model.md").read_text()
    found = re.findall(r'^python -c "(.*?)"$', text, flags=re.S | re.M)
    assert len(found) == 2, found
    return found


SEPARATOR = "--- next snippet ---"
# Each snippet's code as written, in a namespace of its own, in one interpreter: torch and
# transformers are imported once, not once a snippet.
RUN_EACH = f"""
import json, sys
for code in json.loads(sys.argv[1]):
    exec(compile(code, "<snippet>", "exec"), {{"__name__": "__main__"}})
    print({SEPARATOR!r}, flush=True)
"""


def _run_snippets(python: str, export_dir: Path, tmp_path: Path) -> list[str]:
    """Each snippet's output, run from a directory where `./my-model` is the export."""
    (tmp_path / "my-model").symlink_to(export_dir)
    done = subprocess.run([python, "-c", RUN_EACH, json.dumps(snippets())], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    *outputs, rest = done.stdout.split(SEPARATOR + "\n")
    assert len(outputs) == len(snippets()) and not rest, done.stdout
    return outputs


def test_the_docs_snippets_run_on_transformers_5(bytes_export, tmp_path, monkeypatch, capsys):
    """Here, in this interpreter (transformers 5 is imported already): each snippet's code as
    written, in a namespace of its own, where `./my-model` is the export."""
    (tmp_path / "my-model").symlink_to(bytes_export)
    monkeypatch.chdir(tmp_path)
    outputs = []
    for code in snippets():
        exec(compile(code, "<snippet>", "exec"), {"__name__": "__main__"})
        outputs.append(capsys.readouterr().out)
    plain, chat = outputs
    assert plain.startswith("Hello")  # the prompt, then what the model made of it
    assert "<|user|>" not in chat  # the answer alone, not the prompt


def test_the_export_says_what_transformers_4_57_reads(bytes_export):
    """What 4.57's classes read from the files: a tokenizer class it has, the inputs the model
    takes (its PreTrainedTokenizerFast defaults to token_type_ids too, which generate refuses),
    and the dtype `dtype='auto'` loads."""
    from transformers import AutoModelForCausalLM

    written = json.loads((bytes_export / "tokenizer_config.json").read_text())
    assert written["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert written["model_input_names"] == ["input_ids", "attention_mask"]
    assert json.loads((bytes_export / "config.json").read_text())["dtype"] == "bfloat16"
    assert AutoModelForCausalLM.from_pretrained(bytes_export, dtype="auto").dtype == \
        torch.bfloat16


def test_the_docs_snippets_run_on_transformers_4_57(bytes_export, tmp_path):
    plain, chat = _run_snippets(_tf4(), bytes_export, tmp_path)
    assert plain.startswith("Hello") and "<|user|>" not in chat
