-- leaseq schema: renewing a lease writes no index entry.
--
-- A heartbeat sets heartbeat_at, lease_expires_at and progress. lease_expires_at was the
-- key of jobs_lease_idx, so no heartbeat could be a heap-only (HOT) update: each wrote a
-- new entry into the primary key, jobs_lease_idx and every other index whose predicate a
-- running job meets, and left the old ones for vacuum (the claim and the fenced statements
-- then walk them). The reaper's index is now keyed by columns a running job never changes
-- (its queue and job type), so a heartbeat and a checkpoint change no indexed column and no
-- index predicate: PostgreSQL updates the row in place on its page when the page has room.
--
-- Measured (10,000 running jobs held by 1,250 workers of 8 slots, one heartbeat statement
-- per worker): on PostgreSQL 15, 0 of 40,000 updates were HOT before, 39,033 after, and the
-- serving backend's CPU per renewal 31-34 us before, 24-27 us after; on PostgreSQL 18.6
-- (bench/, lease_renewal), 257-315 bytes of WAL per renewal before, 124 after.
--
-- What it costs: the reaper reads every running job's row instead of only the expired ones
-- (at 10,000 running jobs, none expired: 2.8-3.0 ms of CPU per pass before, 1.0-2.6 ms
-- after, as its generic plan now reads one small index; one pass per 5 s by default). The
-- operator's count of running jobs per queue and type reads the new index in its order.

CREATE INDEX jobs_running_idx ON leaseq.jobs (queue, job_type) WHERE status = 'running';
DROP INDEX leaseq.jobs_lease_idx;
