-- Named statements for producers that wait for results, loaded once by leaseq.statements.
-- Each block: `-- name: NAME`, one line saying what it does, then the statement.

-- name: waiter_listen
-- Subscribes a dedicated autocommit connection to job completions (payload: the job id), sent for jobs flagged notify_done.
LISTEN leaseq_done;

-- name: job_watch
-- Registers a waiter for each given unfinished job (a leaseq.job_waiters row, so its final transition notifies leaseq_done); returns the ids a completion was finishing at that moment, which the caller must wait out with job_wait_finishing (see migration 0007).
WITH asked AS MATERIALIZED (
    SELECT a.id, pg_try_advisory_xact_lock(1819370496, mod(a.id, 256)::integer) AS free
      FROM unnest(%(ids)s::bigint[]) AS a(id)
),
flagged AS (
    INSERT INTO leaseq.job_waiters (job_id)
    SELECT j.id FROM leaseq.jobs j JOIN asked a ON a.id = j.id
     WHERE j.status NOT IN ('succeeded', 'dead', 'cancelled')
    -- No conflict target: naming one would need SELECT on job_waiters, which producers lack.
    ON CONFLICT DO NOTHING
)
SELECT a.id FROM asked a WHERE NOT a.free;

-- name: job_watch_enqueued
-- Registers a waiter for each job just enqueued in this same transaction (enqueue with wait): no completion can be finishing a job not yet committed, so it takes no lock (the caller's transaction may be long).
INSERT INTO leaseq.job_waiters (job_id)
SELECT a.id FROM unnest(%(ids)s::bigint[]) AS a(id)
ON CONFLICT DO NOTHING;

-- name: job_wait_finishing
-- Waits (in its own autocommit statement, holding nothing else) until the completions in flight in this job's bucket have ended.
SELECT pg_advisory_xact_lock(1819370496, mod(%(job_id)s::bigint, 256)::integer);

-- name: job_outcomes
-- Status, result, last error and attempts of the given jobs (those that exist), for waiters.
SELECT j.id, j.status, j.result, j.last_error, j.last_error_code, j.attempt_count
  FROM leaseq.job_view j
 WHERE j.id = ANY (%(ids)s::bigint[]);
