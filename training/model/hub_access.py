"""A Hub model the token cannot read (gated, as Llama's and Gemma's are, or private), said in
one line naming the stack's `hfToken`, instead of transformers' multi-line OSError quoted by its
first line ("You are trying to access a gated repo.", which says neither which token nor where
to set it). Standard library only."""

from __future__ import annotations

# transformers 5.13 utils/hub.py `cached_files`: what it raises for huggingface_hub's
# GatedRepoError and RepositoryNotFoundError (a private repository without a valid token).
_GATED = "You are trying to access a gated repo"
_NOT_FOUND = "is not a local folder and is not a valid model identifier"
_TOKEN = ("set the token: `pulumi config set --secret hfToken hf_...` for a stack, HF_TOKEN for "
          "a local run")


def hub_access_error(flag: str, name: str, error: BaseException) -> str | None:
    """The one-line message for `error` raised loading `name` (given as `flag`) when it is a
    token problem, else None."""
    chain = [error, error.__cause__, error.__context__]
    text = " ".join(str(e) for e in chain if e is not None)
    gated = _GATED in text or any(type(e).__name__ == "GatedRepoError" for e in chain if e)
    if gated:
        return (f"{flag} {name!r} is a gated model on the Hugging Face Hub and the token is "
                f"missing or has no access: accept its license on https://huggingface.co/{name} "
                f"with the token's account, then {_TOKEN}")
    if _NOT_FOUND in text:
        return (f"{flag} {name!r}: no such model on the Hugging Face Hub, or a private one the "
                f"token cannot read: check the id, or {_TOKEN}")
    return None
