"""KubeRay's CRDs, fetched by the program itself before any resource is declared.

pulumi-kubernetes' yaml/v2 fetches a `file=` URL on every preview and does not check the HTTP
status (provider/pkg/gen/yaml/v2/yaml.go), so a 404 or a rate limit (429) of the release host
surfaced as a YAML decode error. Here a failed fetch names the URL and the status, and what was
fetched must be the CRD of the expected kind."""

from __future__ import annotations

import functools
import urllib.error
import urllib.request

import yaml

from stack.catalog import kuberay_crd_urls
from training.errors import InputError

FETCH_TIMEOUT_S = 30
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: the files are ~1 MB each


class CrdFetchError(InputError):
    """A CRD of the pinned KubeRay release could not be fetched, or is not that CRD."""


def kuberay_crds(version: str) -> dict[str, str]:
    """Kind -> the YAML text of its CRD in KubeRay `version`, every kind the operator serves."""
    return {kind: fetch_crd(url, kind) for kind, url in kuberay_crd_urls(version).items()}


@functools.cache
def fetch_crd(url: str, kind: str) -> str:
    """The text at `url`, checked to be the ray.io CRD of `kind`. Cached per process: the
    engine runs the program once per preview or update, the tests run it many times."""
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as error:
        retry = " (try again later)" if error.code == 429 or error.code >= 500 else ""
        raise CrdFetchError(f"KubeRay CRD {kind}: GET {url} answered HTTP {error.code} "
                            f"{error.reason}{retry}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise CrdFetchError(f"KubeRay CRD {kind}: GET {url} failed: {reason}") from None
    problem = _not_the_crd(text, kind)
    if problem:
        raise CrdFetchError(f"KubeRay CRD {kind}: {url} is not its CRD: {problem}")
    return text


def _not_the_crd(text: str, kind: str) -> str | None:
    """Why `text` is not one CustomResourceDefinition of ray.io `kind` (None if it is)."""
    try:
        docs = [d for d in yaml.load_all(text, Loader=_LOADER) if d is not None]
    except yaml.YAMLError as error:
        return f"not YAML ({str(error).splitlines()[0]})"
    if len(docs) != 1:
        return f"{len(docs)} YAML documents, expected one"
    doc = docs[0]
    if not isinstance(doc, dict):
        return f"not a YAML object: {str(doc)[:60]!r}"
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    found = (doc.get("kind"), spec.get("group"), (spec.get("names") or {}).get("kind"))
    if found != ("CustomResourceDefinition", "ray.io", kind):
        return f"kind, group and names.kind are {found}"
    return None
