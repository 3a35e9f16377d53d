"""``python held_main.py worker ...``: ``leaseq worker`` whose --isolation process children
are held in their start-up. A spawned child imports its parent's main module (as
``__mp_main__``) before it runs any of the child's own code; here that import records the
child's pid as ``starting-<pid>`` in the working directory and never returns."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from leaseq.cli.main import main

if __name__ == "__mp_main__":
    Path(f"starting-{os.getpid()}").touch()
    threading.Event().wait()  # held: only a signal ends it

if __name__ == "__main__":
    sys.exit(main())
