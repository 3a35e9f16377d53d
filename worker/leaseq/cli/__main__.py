"""``python -m leaseq.cli``: the ``leaseq`` command."""

import sys

from leaseq.cli.main import main

sys.exit(main())
