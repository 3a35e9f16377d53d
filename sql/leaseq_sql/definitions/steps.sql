-- leaseq's present tense: settling a durable step (ctx.step) whose outcome is uncertain.
--
-- Covers: leaseq.step_resolve. It runs as its caller (executable by PUBLIC: a role without
-- UPDATE on leaseq.job_steps and leaseq.jobs is refused by those tables' privileges), so
-- `leaseq steps resolve` settles a step with the operator's role, and the console only
-- through leaseq.console_resolve_step (console.sql), which calls it as its owner and audits.
-- Set off by: step_resolve in queries/steps.sql (Queue.resolve_step) and
-- console_resolve_step in queries/console.sql.

-- Settles an uncertain step of a dead job (an intent without an outcome): records `outcome`
-- as its result, or with `again` clears the intent so the step runs again; says who
-- (`actor`), when (`at`; NULL: now) and why (`reason`) on the step's row; and brings the job
-- back to pending with a fresh budget of attempts, waking its queue's workers, in one
-- statement. One row, the job's id (and the wake-ups sent), when it was settled; none when
-- the job is not dead at an uncertain step of that name.
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
           AND j.status = 'dead' AND s.finished_at IS NULL AND s.lease_token IS NOT NULL
        RETURNING s.job_id
    ),
    revived AS (
        UPDATE leaseq.jobs j
           SET status = 'pending', available_at = t.now, finished_at = NULL, lease_owner = NULL,
               max_attempts = j.attempt_count + j.max_attempts
          FROM t, settled
         WHERE j.id = settled.job_id AND j.status = 'dead'
        RETURNING j.id, j.queue
    ),
    woke AS (SELECT pg_notify('leaseq_jobs', revived.queue) FROM revived)
    SELECT revived.id, (SELECT count(*) FROM woke) FROM revived
$$;
