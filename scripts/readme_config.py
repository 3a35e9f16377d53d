"""Print the README's configuration tables from the settings declarations.

`python scripts/readme_config.py` prints them; tests/unit/test_readme.py checks the README
holds exactly this text between the CONFIGURATION markers.
"""

from __future__ import annotations

from leaseq import config as settings
from leaseq.runtime import settings as worker_settings
from leaseq_operator import config

COMMON = [
    settings.DATABASE_URL,
    settings.METRICS_PORT,
    settings.METRICS_ADDRESS,
    settings.LOG_LEVEL,
    settings.LOG_FORMAT,
]


def tables() -> str:
    """The three tables: options of every role, of the worker, of the operator."""
    worker = [o for o in worker_settings.OPTIONS if o not in COMMON]
    operator = [o for o in config.OPTIONS if o not in COMMON]
    return "\n\n".join(
        [
            "All roles:",
            settings.docs_table(COMMON),
            "`leaseq worker`:",
            settings.docs_table(worker),
            "`leaseq operator`:",
            settings.docs_table(operator),
            "`leaseq migrate` (after migrating, grants each component's role; see SECURITY):",
            settings.docs_table(settings.GRANT_OPTIONS),
        ]
    )


if __name__ == "__main__":
    print(tables())
