"""leaseq for asyncio producers (FastAPI, aiohttp): :class:`AsyncQueue` on a psycopg_pool
``AsyncConnectionPool``; see :mod:`leaseq.core.aio`."""

from leaseq.core.aio import AsyncQueue
from leaseq.core.queue import JobSpec

__all__ = ["AsyncQueue", "JobSpec"]
