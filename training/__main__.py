import sys

from training.driver.cli import main

sys.exit(main())
