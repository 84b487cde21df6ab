"""``python -m simserver``: the simulated server's command line (:mod:`simserver.cli`)."""

import sys

from simserver.cli import main

sys.exit(main())
