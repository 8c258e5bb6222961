"""``python -m compare ...`` is ``twinserve compare ...``."""
from __future__ import annotations

import sys

from compare.cli import main

sys.exit(main(sys.argv[1:]))
