-- leaseq's present tense: settling a durable step (ctx.step) whose outcome is uncertain.
--
-- Covers: leaseq.step_resolve and leaseq.retry_dead. Each runs as its caller (executable by PUBLIC: a role without
-- UPDATE on leaseq.job_steps and leaseq.jobs is refused by those tables' privileges), so
-- `leaseq steps resolve` settles a step with the operator's role, and the console only
-- through leaseq.console_resolve_step (console.sql), which calls it as its owner and audits.
-- Set off by: step_resolve in queries/steps.sql (Queue.resolve_step) and
-- console_resolve_step in queries/console.sql; job_retry_dead in queries/jobs.sql
-- (Queue.retry_dead, `leaseq retry`) and leaseq.console_retry_dead (console.sql).

-- Settles an uncertain step of a held job (an intent without an outcome; or of a dead one,
-- stopped there before migration 53 gave such jobs the status held): records `outcome`
-- as its result, or with `again` clears the intent so the step runs again; says who
-- (`actor`), when (`at`; NULL: now) and why (`reason`) on the step's row; and brings the job
-- back to pending with a fresh budget of attempts, waking its queue's workers, in one
-- statement. One row, the job's id (and the wake-ups sent), when it was settled; none when
-- the job is not held (or dead) at an uncertain step of that name. The status is compared as
-- text: a SQL function's body is analysed when it is created, in the transaction that added
-- the value held (which may not be used before that transaction commits).
CREATE OR REPLACE FUNCTION leaseq.step_resolve(job bigint, step text, outcome jsonb, again boolean,
                                               actor text, reason text, at timestamptz)
RETURNS TABLE (id bigint, notified bigint)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH t AS (SELECT coalesce(step_resolve.at, now()) AS now),
    settled AS (
        UPDATE leaseq.job_steps s
           SET finished_at = CASE WHEN step_resolve.again THEN NULL ELSE t.now END,
               result = CASE WHEN step_resolve.again THEN NULL ELSE step_resolve.outcome END,
               attempt = CASE WHEN step_resolve.again THEN NULL ELSE s.attempt END,
               lease_token = CASE WHEN step_resolve.again THEN NULL ELSE s.lease_token END,
               intended_at = CASE WHEN step_resolve.again THEN NULL ELSE s.intended_at END,
               resolved_by = step_resolve.actor, resolved_at = t.now,
               resolve_reason = step_resolve.reason
          FROM t, leaseq.jobs j
         WHERE s.job_id = step_resolve.job AND s.name = step_resolve.step AND j.id = s.job_id
           AND j.status::text IN ('held', 'dead') AND s.finished_at IS NULL
           AND s.lease_token IS NOT NULL
        RETURNING s.job_id
    ),
    revived AS (
        UPDATE leaseq.jobs j
           SET status = 'pending', available_at = t.now, finished_at = NULL, lease_owner = NULL,
               max_attempts = j.attempt_count + j.max_attempts
          FROM t, settled
         WHERE j.id = settled.job_id AND j.status::text IN ('held', 'dead')
        RETURNING j.id, j.queue
    ),
    woke AS (SELECT pg_notify('leaseq_jobs', revived.queue) FROM revived)
    SELECT revived.id, (SELECT count(*) FROM woke) FROM revived
$$;

-- Brings dead jobs back to pending at `at` (NULL: now) with a fresh budget of `attempts`
-- (NULL: their max_attempts again), keeping id, token and attempt history, in one statement.
-- A job that died of leaseq.WaitTimedOut (ctx.wait_for past its deadline) also has the
-- deadline of that wait withdrawn (the last step `leaseq.wait-<n>` recorded, without a
-- `.signal` outcome),
-- so its next attempt waits afresh with a new deadline and a signal sent after the retry is
-- received; without that it would re-raise at once against the recorded deadline. The row
-- says so (resolved_by 'retry'). A wait with its own step= name keeps its deadline: nothing
-- in its name says it is one. Returns each job revived, its queue and new max_attempts.
CREATE OR REPLACE FUNCTION leaseq.retry_dead(job_ids bigint[], attempts integer, at timestamptz)
RETURNS TABLE (id bigint, queue text, max_attempts integer)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    WITH t AS (SELECT coalesce(retry_dead.at, now()) AS now),
    revived AS (
        UPDATE leaseq.jobs j
           SET status = 'pending', available_at = t.now, finished_at = NULL, lease_owner = NULL,
               max_attempts = j.attempt_count + coalesce(retry_dead.attempts, j.max_attempts)
          FROM t
         WHERE j.id = ANY(retry_dead.job_ids) AND j.status = 'dead'
        RETURNING j.id, j.queue, j.max_attempts, j.last_error_code
    ),
    withdrawn AS (
        UPDATE leaseq.job_steps s
           SET attempt = NULL, lease_token = NULL, intended_at = NULL, finished_at = NULL,
               result = NULL, note = NULL, resolved_by = 'retry', resolved_at = t.now,
               resolve_reason = 'the wait timed out; retried with a new deadline'
          FROM t, revived r
         WHERE s.job_id = r.id AND r.last_error_code = 'WaitTimedOut'
           AND s.name LIKE 'leaseq.wait-%' AND s.name NOT LIKE '%.signal'
           -- The wait it died at is the last one the handler reached: an earlier wait
           -- whose WaitTimedOut the handler caught keeps its deadline.
           AND s.finished_at = (SELECT max(w.finished_at) FROM leaseq.job_steps w
                                 WHERE w.job_id = s.job_id AND w.name LIKE 'leaseq.wait-%'
                                   AND w.name NOT LIKE '%.signal')
           AND NOT EXISTS (SELECT 1 FROM leaseq.job_steps g
                            WHERE g.job_id = s.job_id AND g.name = s.name || '.signal'
                              AND g.finished_at IS NOT NULL)
        RETURNING s.job_id
    )
    SELECT r.id, r.queue, r.max_attempts FROM revived r
$$;
