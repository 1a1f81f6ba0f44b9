"""`--data hf://org/name[/config][@revision][:split]`: one split of a Hugging Face Hub dataset.

Fetched with huggingface_hub's own `snapshot_download` into its cache (`HF_HUB_CACHE`, shared with
the models; `HF_TOKEN` for gated or private sets), in two calls on one code path, online and
offline: the dataset card first (its snapshot folder is named by the commit the revision resolves
to), then only the split's files at that commit. Which files a config and split hold follows the
`datasets` library: the card's YAML `configs` (`config_name`, `data_files` as `{split, path}`
patterns, `data_dir`), else its default patterns (huggingface/datasets src/datasets/data_files.py:
`data/{split}-00000-of-00001.*` shards, then the split's keywords in a directory name, then in a
file name). The commit is the data's identity: another revision is another dataset.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from training.data import DataError
from training.errors import first_line

PREFIX = "hf://"
_URI = re.compile(r"^hf://(?P<repo>[\w.-]+/[\w.-]+)(?:/(?P<config>[\w.-]+))?"
                  r"(?:@(?P<revision>[^:\s]+))?(?::(?P<split>\w+(?:\.\w+)*))?$")
CARD = "README.md"
# datasets' data_files.py: SPLIT_KEYWORDS, and NON_WORDS_CHARS around a keyword.
SPLIT_KEYWORDS = {"train": ("train", "training"),
                  "validation": ("validation", "valid", "dev", "val"),
                  "test": ("test", "testing", "eval", "evaluation")}
_SEP = "[-._ 0-9]"


def is_hub(uri: str) -> bool:
    return uri.startswith(PREFIX)


_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
PROBE_TIMEOUT_S = 3.0
_offline_because: list[str] = []  # why this process reads only the cache, once it does


def offline_unless_reachable(names: list[str | None], timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Read only the local hub cache, as HF_HUB_OFFLINE=1 does, when one of `names` (an hf://
    dataset, a model or tokenizer id) is on the Hub and its endpoint (or the HTTPS proxy) takes
    no TCP connection within `timeout_s`. Without this, huggingface_hub retries every request
    with backoff (utils/_http.py `http_backoff`, 5 retries): minutes and a dozen lines before the
    one error. `is_offline_mode()` reads the constant at each call, so transformers follows."""
    import socket
    import urllib.request
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or not any(n and _on_hub(n) for n in names):
        return
    target = urlparse(urllib.request.getproxies().get("https") or constants.ENDPOINT)
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((target.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        constants.HF_HUB_OFFLINE = True
        os.environ["HF_HUB_OFFLINE"] = "1"  # for processes started from here (local Ray)
        _offline_because.append(f"the Hugging Face Hub at {constants.ENDPOINT} is unreachable "
                                f"({first_line(e)}) and the local cache has no copy")


def offline_reason() -> str | None:
    """Why a Hub read failed when this process went offline, for the error line."""
    return _offline_because[0] if _offline_because else None


def _on_hub(name: str) -> bool:
    return is_hub(name) or is_repo_id(name)


def is_repo_id(name: str) -> bool:
    """`org/name` that is no local path: a model or tokenizer on the Hub."""
    return bool(_REPO_ID.match(name)) and not Path(name).exists()


@dataclass(frozen=True)
class HubSplit:
    """One split of one config of a dataset repository, at a revision."""
    repo: str
    config: str | None
    revision: str
    split: str

    @classmethod
    def parse(cls, uri: str, flag: str) -> "HubSplit":
        m = _URI.match(uri)
        if not m:
            raise DataError(f"{flag} {uri!r}: expected hf://org/name with an optional /config, "
                            "@revision and :split (e.g. hf://trl-lib/Capybara:test)")
        return cls(m["repo"], m["config"], m["revision"] or "main", m["split"] or "train")


@dataclass(frozen=True)
class Snapshot:
    """The split's files in the local hub cache: `folder` is `snapshots/<commit>`."""
    repo: str
    folder: str
    commit: str
    files: tuple[str, ...]  # relative to `folder`, sorted


def fetch(uri: str, flag: str, suffixes: tuple[str, ...]) -> Snapshot:
    """Download (or find in the cache) the split's data files with those suffixes."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    split = HubSplit.parse(uri, flag)

    def download(revision: str, patterns: list[str]) -> str:
        # Offline (HF_HUB_OFFLINE) only the cache is read, as transformers does it: otherwise a
        # commit revision lists the repository over HTTP even then (_snapshot_download.py).
        try:
            return snapshot_download(split.repo, repo_type="dataset", revision=revision,
                                     allow_patterns=patterns,
                                     local_files_only=constants.HF_HUB_OFFLINE)
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
            why = offline_reason() or f"{type(e).__name__}: {first_line(e)}"
            raise DataError(f"{flag} {uri!r}: cannot fetch it from the Hugging Face Hub "
                            f"({why}); HF_HUB_OFFLINE=1 reads only the local cache") from None

    folder = download(split.revision, [CARD])
    commit = Path(folder).name
    try:
        families = split_patterns(Path(folder, CARD), split)
    except ValueError as e:  # the card names no such config or split
        raise DataError(f"{flag} {uri!r}: {e}") from None
    folder = download(commit, sorted({q for f in families for p in f for q in _allowed(p)}))
    files = _local_files(folder, suffixes)
    for family in families:  # the first family that matches, as datasets resolves them
        chosen = tuple(f for f in files if any(glob(p).fullmatch(f) for p in family))
        if chosen:
            return Snapshot(split.repo, folder, commit, chosen)
    raise DataError(f"{flag} {uri!r}: no {'/'.join(suffixes)} files of split {split.split!r} "
                    f"at commit {commit[:12]} (it has: {', '.join(files) or 'none'})")


def split_patterns(card: Path, split: HubSplit) -> list[list[str]]:
    """Glob pattern families that may hold the split, in datasets' order of precedence."""
    configs = _card_configs(card)
    base = split.config or ""  # no card configs: a config is a directory (refs/convert/parquet)
    if configs:
        config = _pick_config(configs, split)
        base = str(config.get("data_dir") or "").strip("/")
        if config.get("data_files") is not None:
            splits = _data_files(config["data_files"])
            if split.split not in splits:
                raise ValueError(f"config {config.get('config_name', 'default')!r} has no split "
                                 f"{split.split!r} (splits: {', '.join(splits)}; add :<split>)")
            return [[_under(base, p) for p in splits[split.split]]]
    return [[_under(base, p) for p in family] for family in _default_families(split.split)]


def _card_configs(card: Path) -> list[dict]:
    if not card.is_file():
        return []
    from huggingface_hub.repocard import metadata_load

    configs = (metadata_load(card) or {}).get("configs") or []
    return [c for c in configs if isinstance(c, dict)]


def _pick_config(configs: list[dict], split: HubSplit) -> dict:
    """The named config; else the card's default, the one called `default`, or the only one."""
    names = [str(c.get("config_name", "default")) for c in configs]
    if split.config is not None:
        if split.config not in names:
            raise ValueError(f"no config {split.config!r} (configs: {', '.join(names)})")
        return configs[names.index(split.config)]
    chosen = [c for c in configs if c.get("default")] or \
        [c for c, n in zip(configs, names) if n == "default"] or \
        (configs if len(configs) == 1 else [])
    if not chosen:
        raise ValueError("several configs and none is the default; name one: " +
                         ", ".join(f"hf://{split.repo}/{n}" for n in names))
    return chosen[0]


def _data_files(files) -> dict[str, list[str]]:
    """A card's `data_files` as {split: patterns}, as datasets' `sanitize_patterns` reads it (a
    pattern or a list of them is the train split; else `{split, path}` entries or a mapping)."""
    if isinstance(files, str):
        return {"train": [files]}
    if isinstance(files, dict):
        return {str(k): v if isinstance(v, list) else [v] for k, v in files.items()}
    if all(isinstance(f, dict) for f in files):
        return {str(f["split"]): f["path"] if isinstance(f["path"], list) else [f["path"]]
                for f in files}
    return {"train": list(files)}


def _default_families(split: str) -> list[list[str]]:
    """datasets' defaults (fsspec >= 2023.12): a sharded `data/{split}-...` file, then the
    split's keyword in a directory name, then in a file name."""
    words = SPLIT_KEYWORDS.get(split, (split,))
    return [[f"data/{split}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]*.*"],
            [p.format(k=k, s=_SEP) for k in words for p in
             ("**/{k}/**", "**/{k}{s}*/**", "**/*{s}{k}/**", "**/*{s}{k}{s}*/**")],
            [p.format(k=k, s=_SEP) for k in words for p in ("**/{k}{s}*", "**/*{s}{k}{s}*")]]


def _under(base: str, pattern: str) -> str:
    return f"{base}/{pattern}" if base else pattern


def _allowed(pattern: str) -> set[str]:
    """huggingface_hub's `allow_patterns` are fnmatch patterns (`*` crosses `/`, but a leading
    `**/` needs a directory): the glob and its top-level form."""
    return {pattern, pattern.removeprefix("**/")}


def glob(pattern: str) -> re.Pattern:
    """datasets' glob semantics (fsspec >= 2023.12): `*` within a name, `**` across directories."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] in "*?":
            out, i = out + ("[^/]*" if pattern[i] == "*" else "[^/]"), i + 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 1)) > i:
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _local_files(folder: str, suffixes: tuple[str, ...]) -> list[str]:
    """Data files under the snapshot folder (links into the cache's blobs followed), relative."""
    out = []
    for d, _, names in os.walk(folder, followlinks=True):
        out += [Path(d, n).relative_to(folder).as_posix() for n in names if n.endswith(suffixes)]
    return sorted(out)
