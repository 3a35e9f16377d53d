"""A lease's secret: what proves who holds a lease, where its token only orders executions.

Each claim call mints a claim secret (32 random bytes) and sends it only in its claim
statement. Each job the call leases gets a secret of its own, ``sha256(claim secret || id)``
(the id as 8 big-endian bytes), so a job's secret says nothing of its siblings' or of the
claim secret. PostgreSQL keeps only ``sha256(job secret)`` (``jobs.lease_digest``, written by
the claim) and every write under the lease presents the job's secret. Any login can read a
job's token and digest; neither lets it act under the lease. A claim's id is readable too:
the recovery of a claim whose answer was lost finds its rows by id and proves them by the
claim secret, which only the claimer holds.
"""

from __future__ import annotations

import hashlib
import secrets

#: Bytes of randomness in a claim secret.
SECRET_BYTES = 32


def claim_secret() -> bytes:
    """A new claim secret, from the operating system's CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def job_secret(claim: bytes, job_id: int) -> bytes:
    """The secret of job ``job_id``'s lease taken by the claim whose secret is ``claim``;
    the claim statements write the digest of the same value."""
    return hashlib.sha256(claim + job_id.to_bytes(8, "big", signed=True)).digest()


def digest(secret: bytes) -> bytes:
    """What PostgreSQL keeps of a lease's secret."""
    return hashlib.sha256(secret).digest()
