"""``python -m kvrelay.cli``: the same as the ``kvrelay`` command."""

import sys

from kvrelay.cli.main import main

sys.exit(main())
