"""``python -m copyless ...`` is the ``copyless`` console script."""

import sys

from copyless.broker.cli import main

sys.exit(main())
