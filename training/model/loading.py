"""Pretrained weights read once per run, not once per GPU, and model directories on S3.

Rank 0 alone reads the weights (`from_pretrained` on the host, fp32: the master weights, exactly
as a single process loads them; bf16 for a frozen LoRA base, its adapters injected there so their
init travels with it); every other rank builds the model on the meta device. After
`fully_shard`, every rank materializes its empty shards and `set_model_state_dict(...,
StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))` sends each tensor from rank 0
and keeps only the local shard (torch/distributed/checkpoint/state_dict.py
`_load_model_state_dict` -> `_broadcast_state_dict`, one tensor at a time; present in torch 2.11
and 2.13). A node then holds one full copy (rank 0's) instead of one per GPU, and downloads
(hub or S3) happen once.

Why not DCP's `HuggingFaceStorageReader` (torch/distributed/checkpoint/hf_storage.py): its
`read_data` opens the safetensors files on every rank (`safe_open` per rank and file), so every
node would need the files on local disk (an S3 download per node) and every rank reads them;
and it loads into the model's keys as they are (our `lm.` wrapper prefix, the tied LM head under
two names), where `from_pretrained` on rank 0 applies transformers' own key mapping and tying.

The materialized shards are filled with `to_empty` and then overwritten by the broadcast, so the
tied LM head stays one parameter (copying into a parameter keeps it; `assign` would not).
Non-persistent buffers (the rotary `inv_freq`) are in no state dict: they are recomputed by the
model's own `_init_weights`, as `from_pretrained` does for keys missing from a checkpoint.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import PurePosixPath

import pyarrow.fs as pafs
from pyarrow.lib import ArrowException
from training.errors import InputError

CONFIG_FILE = "config.json"
WEIGHTS_FILE, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class ModelError(InputError):
    """The model named by --model (or its tokenizer) cannot be used."""


def is_s3(spec: str) -> bool:
    return spec.startswith("s3://")


def is_directory(spec: str) -> bool:
    """A model given as a directory (local or on S3), not as a hub id or built-in shape."""
    return is_s3(spec) or os.path.isdir(spec)


def looks_like_path(spec: str) -> bool:
    """A --model written as a path (`./x`, `/x`, `~/x`, `a/b/c`), not a Hub `org/name`."""
    return spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1


def _s3(uri: str) -> tuple[pafs.FileSystem, str]:
    """The run's own S3 credentials (Pod Identity on EKS; AWS_ENDPOINT_URL for test servers)."""
    from training.storage import StorageError, resolve

    try:
        storage = resolve(uri, flag="--model")
    except StorageError as e:
        raise ModelError(str(e)) from None
    return storage.filesystem, storage.path


def _listing(spec: str) -> dict[str, int]:
    """{relative file name: size} of the directory's top level."""
    if not is_s3(spec):
        return {n: os.path.getsize(os.path.join(spec, n)) for n in os.listdir(spec)
                if os.path.isfile(os.path.join(spec, n))}
    fs, path = _s3(spec)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except (OSError, ArrowException) as e:
        raise ModelError(f"--model {spec!r}: cannot list it ({str(e).splitlines()[0]})") from None
    return {i.base_name: i.size or 0 for i in infos if i.type == pafs.FileType.File}


def check_model_dir(spec: str) -> None:
    """Refuse, before anything starts, a directory that lacks config.json or safetensors weights
    (or whose weight index names shards that are not there), listing what it holds."""
    files = _listing(spec)
    problems = []
    if CONFIG_FILE not in files:
        problems.append(f"no {CONFIG_FILE}")
    if WEIGHTS_INDEX in files:
        index = json.loads(_read_text(spec, WEIGHTS_INDEX))
        missing = sorted(set(index.get("weight_map", {}).values()) - set(files))
        if missing:
            problems.append(f"{WEIGHTS_INDEX} names shards that are not there: {missing}")
    elif WEIGHTS_FILE not in files:
        problems.append(f"no {WEIGHTS_FILE} (or {WEIGHTS_INDEX} with its shards)")
    if problems:
        held = ", ".join(sorted(files)) or "nothing"
        raise ModelError(f"--model {spec!r} is not a Hugging Face model directory: "
                            f"{'; '.join(problems)} (it holds: {held}); point it at a directory "
                            "written by save_pretrained or by this job's export")


def _read_text(spec: str, name: str) -> str:
    if not is_s3(spec):
        with open(os.path.join(spec, name)) as f:
            return f.read()
    fs, path = _s3(spec)
    with fs.open_input_stream(f"{path}/{name}") as f:
        return f.read().decode()


@functools.cache
def local_dir(spec: str) -> str:
    """A directory Hugging Face loaders can read for `spec` without its weights (config,
    tokenizer, generation config): an s3:// directory is copied once per process into a temporary
    directory; anything else (hub id, local directory) is returned as it is."""
    if not is_s3(spec):
        return spec
    return _download(spec, weights=False)


def _download(spec: str, *, weights: bool) -> str:
    fs, path = _s3(spec)
    out = tempfile.mkdtemp(prefix="model-")
    for name in _listing(spec):
        if not weights and name.endswith(_WEIGHT_SUFFIXES):
            continue
        with fs.open_input_stream(f"{path}/{name}") as src, \
                open(os.path.join(out, PurePosixPath(name).name), "wb") as dst:
            while chunk := src.read(64 * 2**20):
                dst.write(chunk)
    return out


def weights_dir(spec: str) -> str:
    """A local directory holding `spec`'s weights: S3 is downloaded (into a fresh temporary
    directory), a hub id is fetched into the hub cache, a local directory is used in place."""
    if is_s3(spec):
        return _download(spec, weights=True)
    if os.path.isdir(spec):
        return spec
    from huggingface_hub import snapshot_download

    return snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"])


def host_rss_gib() -> float:
    """This process's peak resident host memory so far (getrusage: KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def rank0_state(spec: str, config, rank: int, dtype=None, prepare=None) -> dict | None:
    """Rank 0's full state dict of `spec`, exactly as from_pretrained loads it in `dtype`
    (default fp32; tied keys included), after `prepare(model)` (LoRA: the adapters injected, so
    their init travels with the base); None on every other rank, which reads nothing."""
    if rank != 0:
        return None
    import torch
    from transformers import AutoModelForCausalLM

    local = weights_dir(spec)
    try:
        lm = AutoModelForCausalLM.from_pretrained(local, config=config,
                                                  dtype=dtype or torch.float32,
                                                  attn_implementation="sdpa")
        if prepare is not None:
            prepare(lm)
        return lm.state_dict()
    finally:
        if is_s3(spec):  # our own temporary download
            shutil.rmtree(local, ignore_errors=True)


def load_sharded(model, full_state: dict | None, device, started: float) -> dict:
    """Collective: fill the sharded meta `model` from rank 0's `full_state`. Returns the load's
    seconds (from `started`, reading included, slowest rank) and each rank's peak host RSS."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    lm = model.lm
    with torch.no_grad():
        for module in lm.modules():
            if module._non_persistent_buffers_set:
                lm._init_weights(module)
    # Keys as the sharded model names them: under the loss wrapper's `lm.`.
    state = {f"lm.{k}": v for k, v in full_state.items()} if full_state is not None else {}
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True,
                                                                broadcast_from_rank0=True))
    del state, full_state
    mine = (time.perf_counter() - started, host_rss_gib())
    every = [mine] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {"load_s": max(s for s, _ in every),
            "load_host_rss_gib": [round(r, 3) for _, r in every]}
