"""``python -m pipeline.cli``: the same program as ``lithi-bundle``."""

import sys

from pipeline.cli import main

sys.exit(main())
