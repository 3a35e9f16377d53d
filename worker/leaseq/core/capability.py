"""A lease's secret: what proves who holds a lease, where its token only orders executions.

Each claim call mints a secret (32 random bytes) and sends it only in its claim statement;
the leases of the jobs it takes carry that secret. PostgreSQL keeps, per job, only
``sha256(secret)`` (``jobs.lease_digest``, written by the claim), and every write under a
lease presents the secret and is checked against the digest. Any login can read a job's
token and digest; neither lets it act under the lease. The secret never leaves the claiming
process: a :class:`~leaseq.core.models.Lease` does not print it, and a process-isolation
child gets none (its supervisor makes its calls). A claim's id is readable too: the recovery
of a claim whose answer was lost finds its rows by id and proves them by the secret, which
only the claimer holds.

One digest per claim call, the same on each job it took: the claimer holds every lease of
its call, and nothing else holds any, so a digest per job (``sha256(secret || id)``, as
first written) told no holder from another and cost a hash per job at the claim and at
each check (about 7,000 server instructions each, +6% of a no-op job's server work). Now
a claim hashes once, and a batch of completions or renewals once per run of equal secrets.
A new claim of the same job mints a new secret, so a reissued lease never takes the old
holder's.
"""

from __future__ import annotations

import hashlib
import secrets

#: Bytes of randomness in a claim's secret.
SECRET_BYTES = 32


def claim_secret() -> bytes:
    """A new claim's secret, from the operating system's CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def digest(secret: bytes) -> bytes:
    """What PostgreSQL keeps of each lease a claim took with ``secret``."""
    return hashlib.sha256(secret).digest()
