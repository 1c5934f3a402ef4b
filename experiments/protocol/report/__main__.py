"""``python -m experiments.protocol.report``: rewrites docs/results.md and docs/results/protocol/*.png."""

import sys

from .document import main

sys.exit(main())
