"""`pulumi up` entry point: run the program; bad input is one clear error and a non-zero exit."""

import sys

import pulumi

from training.errors import InputError

try:
    import program

    program.run()
except InputError as error:  # stack config, zones, job settings, code bundle
    pulumi.log.error(str(error))
    sys.exit(1)
