"""``python -m zerotune.cli``: the ``zerotune`` command."""

import sys

from . import main

sys.exit(main())
