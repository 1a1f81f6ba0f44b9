"""`pulumi up` entry point: run the program; bad input is one clear error and a non-zero exit."""

import sys

import pulumi

from infra.config import ConfigError
from infra.zones import NetworkError
from workloads.code_bundle import CodeBundleError

try:
    import program

    program.run()
except (ConfigError, NetworkError, CodeBundleError) as error:
    pulumi.log.error(str(error))
    sys.exit(1)
