"""``python -m modelc ...``: the ``modelc`` command."""

import sys

from modelc.cli import main

sys.exit(main())
