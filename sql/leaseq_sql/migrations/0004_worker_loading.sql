-- leaseq schema, version 4: workers report `loading` while their on_startup hook runs (a
-- model load), and how long it took; the operator counts loading pods as capacity already
-- coming and sizes pools that scale on work from recent run times per job type.

ALTER TABLE leaseq.workers DROP CONSTRAINT workers_state_check;
ALTER TABLE leaseq.workers ADD CONSTRAINT workers_state_check
    CHECK (state IN ('loading', 'running', 'draining'));

-- Seconds on_startup took in this worker; NULL while it is still loading.
ALTER TABLE leaseq.workers ADD COLUMN startup_seconds double precision
    CONSTRAINT workers_startup_seconds CHECK (startup_seconds >= 0);

-- The recent attempts that ran a handler to its end, newest first: what pool_work reads
-- (a bounded window of them) to estimate run time per job type. Covering, so the read is
-- an index-only scan on a table that only grows.
CREATE INDEX job_attempts_ended_idx ON leaseq.job_attempts (ended_at) INCLUDE (job_id, started_at)
    WHERE outcome IN ('succeeded', 'failed', 'timed_out');
