"""``python -m service.cli``: the ``hypsearch`` command."""

import sys

from service.cli import main

sys.exit(main())
