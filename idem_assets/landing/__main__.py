"""``python -m idem_assets.landing``: the landing zone's command line."""

import sys

from idem_assets.landing.cli import main

sys.exit(main())
