"""``python -m isq.report``: see :mod:`isq.report.cli`."""

import sys

from isq.report.cli import main

sys.exit(main())
