-- leaseq schema, version 1. Applied by `leaseq migrate` inside one transaction.
-- Everything lives in the `leaseq` schema so it never collides with the user's tables.

CREATE TYPE leaseq.job_status AS ENUM ('pending', 'running', 'succeeded', 'dead', 'cancelled');

CREATE TYPE leaseq.attempt_outcome AS ENUM (
    'succeeded', 'failed', 'lease_expired', 'released', 'fenced', 'timed_out', 'cancelled'
);

CREATE TABLE leaseq.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text NOT NULL,
    job_type         text NOT NULL,
    payload          jsonb NOT NULL DEFAULT '{}'::jsonb,
    status           leaseq.job_status NOT NULL DEFAULT 'pending',
    -- Lower value runs first (0 is the most urgent), like nice(1), River and Oban.
    priority         smallint NOT NULL DEFAULT 100,
    attempt_count    integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 5,
    created_at       timestamptz NOT NULL DEFAULT now(),
    available_at     timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    -- While running: the owner. In a finished row: the worker that last held it.
    lease_owner      text,
    -- Fencing token: +1 on every claim and every release, never reset.
    lease_token      bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    heartbeat_at     timestamptz,
    progress         jsonb,
    -- Maximum runtime of one attempt, separate from the rolling lease.
    timeout          interval,
    last_error       text,
    last_error_code  text,
    -- Effect key derived from the work; completion writes job_results through it.
    idempotency_key  text,
    -- Enqueue de-duplication among jobs that have not finished.
    dedup_key        text,
    result           jsonb,
    -- Durable handler state that the next attempt receives.
    checkpoint       jsonb,

    CONSTRAINT jobs_queue_name CHECK (length(queue) BETWEEN 1 AND 128),
    CONSTRAINT jobs_job_type_name CHECK (length(job_type) BETWEEN 1 AND 128),
    CONSTRAINT jobs_attempts CHECK (max_attempts >= 1 AND attempt_count >= 0),
    CONSTRAINT jobs_timeout_positive CHECK (timeout IS NULL OR timeout > interval '0'),
    -- A running row always names its owner and the end of its lease, so an orphan is a
    -- predicate (status = 'running' AND lease_expires_at < now()), never a guess.
    CONSTRAINT jobs_running_leased CHECK (
        status <> 'running' OR (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)
    ),
    CONSTRAINT jobs_finished_at CHECK (
        (status IN ('pending', 'running')) = (finished_at IS NULL)
    )
);

-- The claim walks this index in the claim's ORDER BY and stops at the first free row.
-- It holds only pending rows, so finished history is invisible to it.
CREATE INDEX jobs_claim_idx ON leaseq.jobs (queue, priority, available_at, id)
    WHERE status = 'pending';

-- The reaper's index: one entry per in-flight job, whatever the size of the table.
CREATE INDEX jobs_lease_idx ON leaseq.jobs (lease_expires_at) WHERE status = 'running';

CREATE UNIQUE INDEX jobs_dedup_idx ON leaseq.jobs (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running');

CREATE INDEX jobs_dead_idx ON leaseq.jobs (queue, finished_at) WHERE status = 'dead';

CREATE INDEX jobs_finished_idx ON leaseq.jobs (finished_at)
    WHERE status IN ('succeeded', 'dead', 'cancelled');

-- Churn, not history, is what slows a queue's claim: every claim leaves a dead entry at the
-- head of jobs_claim_idx, and a scan reads every page of them until VACUUM removes them.
-- Vacuum this table after a fixed number of changes (not a fraction of a table that only
-- grows), without cost throttling, so the dead head stays short. fillfactor stays at 100:
-- every transition changes an indexed column or index predicate, so no update can be HOT.
ALTER TABLE leaseq.jobs SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 5000,
    autovacuum_vacuum_cost_delay = 0
);

-- Effects, keyed by a key derived from the work: a repeat execution's insert does nothing.
-- No foreign key: effects outlive the pruning of their job rows, and keep guarding repeats.
CREATE TABLE leaseq.job_results (
    idempotency_key text PRIMARY KEY,
    job_id          bigint NOT NULL,
    produced_by     text NOT NULL,
    produced_at     timestamptz NOT NULL DEFAULT now(),
    result          jsonb NOT NULL
);

-- The audit trail: one row per attempt (per lease token). "What happened to job 47" is
-- SELECT * FROM leaseq.job_attempts WHERE job_id = 47 ORDER BY lease_token.
CREATE TABLE leaseq.job_attempts (
    job_id      bigint NOT NULL,
    attempt     integer NOT NULL,
    lease_token bigint NOT NULL,
    worker      text NOT NULL,
    started_at  timestamptz,
    ended_at    timestamptz NOT NULL DEFAULT now(),
    outcome     leaseq.attempt_outcome NOT NULL,
    error       text,
    PRIMARY KEY (job_id, lease_token)
);

CREATE TABLE leaseq.workers (
    worker_id    text PRIMARY KEY,
    pod          text,
    node         text,
    queues       text[] NOT NULL,
    concurrency  integer NOT NULL CHECK (concurrency >= 1),
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    state        text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'draining')),
    in_flight    integer NOT NULL DEFAULT 0 CHECK (in_flight >= 0)
) WITH (fillfactor = 50);

-- Backoff before retry number `attempt` + 1: capped exponential with equal jitter, computed
-- in the database so fail() and the reaper share one formula and one clock.
CREATE FUNCTION leaseq.retry_delay(attempt integer, base_seconds double precision,
                                   cap_seconds double precision)
RETURNS interval
LANGUAGE sql VOLATILE
AS $$
    SELECT make_interval(secs => d / 2 + random() * d / 2)
      FROM (SELECT least(cap_seconds, base_seconds * power(2, greatest(attempt, 1) - 1)) AS d) s
$$;

-- Leader lease for singletons (the reaper): a row per name with a term that only the holder
-- can renew; a new holder takes the row only after the lease has expired.
CREATE TABLE leaseq.leader_leases (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    term       bigint NOT NULL,
    expires_at timestamptz NOT NULL
);

-- What operators read: every job with its timeout in seconds and its status as text.
CREATE VIEW leaseq.job_view AS
SELECT j.id, j.queue, j.job_type, j.payload, j.status::text AS status, j.priority, j.attempt_count,
       j.max_attempts, j.created_at, j.available_at, j.started_at, j.finished_at, j.lease_owner,
       j.lease_token, j.lease_expires_at, j.heartbeat_at, j.progress,
       extract(epoch FROM j.timeout)::float8 AS timeout_seconds, j.last_error, j.last_error_code,
       j.idempotency_key, j.dedup_key, j.result, j.checkpoint
  FROM leaseq.jobs j;
