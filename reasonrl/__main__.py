"""``python -m reasonrl``: the command line, as torchrun launches it (``torchrun ... -m reasonrl train ...``)."""

import sys

from reasonrl.cli import main

sys.exit(main())
