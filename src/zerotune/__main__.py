"""``python -m zerotune``: the ``zerotune`` command."""

import sys

from .cli import main

sys.exit(main())
