"""A lease's secret: what proves who holds a lease, where its token only orders executions.

Each claim call mints a secret (32 random bytes) and sends it only in its claim statement;
the leases of the jobs it takes carry that secret. PostgreSQL keeps, per job, only
``sha256(secret || id)`` (the id as 8 big-endian bytes: ``jobs.lease_digest``, written by the
claim), and every write under a lease presents the secret and is checked against the
digest. Any login can read a job's token and digest; neither lets it act under the lease.
The secret never leaves the claiming process: a :class:`~leaseq.core.models.Lease` does not
print it, and a process-isolation child gets none (its supervisor makes its calls). A
claim's id is readable too: the recovery of a claim whose answer was lost finds its rows by
id and proves them by the secret, which only the claimer holds.

One hash per job when the claim writes the digest and one when a call is checked: a secret
per job, derived from the claim's, cost the claim a second hash per job for no reader (the
claimer holds every lease of its call, and nothing else holds any).
"""

from __future__ import annotations

import hashlib
import secrets

#: Bytes of randomness in a claim's secret.
SECRET_BYTES = 32


def claim_secret() -> bytes:
    """A new claim's secret, from the operating system's CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def digest(secret: bytes, job_id: int) -> bytes:
    """What PostgreSQL keeps of the lease on job ``job_id`` taken with ``secret``."""
    return hashlib.sha256(secret + job_id.to_bytes(8, "big", signed=True)).digest()
