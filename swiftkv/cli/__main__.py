"""``python -m swiftkv.cli``: the same as the ``swiftkv`` command."""

import sys

from swiftkv.cli import main

sys.exit(main())
