import sys

from bench.benchmark import main

sys.exit(main())
