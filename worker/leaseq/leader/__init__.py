"""The leader's duties (reaping, schedules, history, retention, vacuum) under the leader
lease: run by the operator's leader, by ``leaseq reaper`` and, where neither is deployed, by
the worker that wins the lease. It uses only the core's faces, so the runtime and the
operator both run it without importing each other."""
