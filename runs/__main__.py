import sys

from runs.cli import main

sys.exit(main())
