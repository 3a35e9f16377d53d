"""bench/ is a folder of the repository, not part of the installed package: put the
repository root on sys.path for these tests. Appended, not prepended, so nothing in the root
can shadow an installed or standard-library module."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
