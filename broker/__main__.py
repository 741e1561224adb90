import sys

from copyless.broker.cli import main

sys.exit(main())
