"""The Pulumi CLI the program runs under, checked before anything is declared."""

from __future__ import annotations

import pulumi

from stack.catalog import PULUMI_CLI_MIN
from training.errors import InputError

INSTALL_PAGE = "https://www.pulumi.com/docs/iac/download-install/"


class EngineVersionError(InputError):
    """The Pulumi CLI is older than the program needs."""


def require_cli(minimum: str = PULUMI_CLI_MIN) -> None:
    """Stop with the version to install on an older CLI. The engine answers the range check
    (Engine.RequirePulumiVersion, pulumi/runtime/settings.py require_pulumi_version); a CLI that
    predates that RPC (before 3.217.0, stack/catalog.py) answers UNIMPLEMENTED, which the SDK
    raises: both end here, before anything is declared."""
    try:
        pulumi.runtime.require_pulumi_version(f">={minimum}")
    except Exception as error:  # noqa: BLE001 - the engine's refusal, whatever its form
        raise EngineVersionError(
            f"Pulumi CLI {minimum} or newer is needed (its engine answers the program's version "
            f"check and keeps pulumi.Stash values); this one refused: {error}. Install a newer CLI: "
            f"{INSTALL_PAGE}") from None
