"""``python -m hvdcompat.runner``: the same as ``hvdcompatrun``."""

import sys

from hvdcompat.runner.launch import main

sys.exit(main())
