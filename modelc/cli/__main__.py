"""``python -m modelc.cli ...``: the ``modelc`` command."""

import sys

from modelc.cli import main

sys.exit(main())
