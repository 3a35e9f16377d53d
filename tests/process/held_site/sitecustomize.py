"""Put first on ``PYTHONPATH``, this holds every ``--isolation process`` child of a worker
inside its interpreter's start-up (``site`` imports it before any other module of the child's
is imported, leaseq's included): it records the child's pid as ``starting-<pid>`` in the
working directory and never returns. The worker itself, and anything else, starts as usual."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

if "--multiprocessing-fork" in sys.orig_argv and "from multiprocessing.spawn" in " ".join(
    sys.orig_argv
):
    Path(f"starting-{os.getpid()}").touch()
    threading.Event().wait()  # held: only a signal ends it
