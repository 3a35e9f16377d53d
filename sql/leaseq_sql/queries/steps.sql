-- Named statements of durable steps (ctx.step): a handler's intent and outcome, each fenced
-- by the attempt's lease in one statement, and an operator's resolution of an uncertain step.
--
-- The fenced ones lock the job's row FOR SHARE while they check the lease: the reaper's
-- expiry (an UPDATE of that row) waits for them or they wait for it and see the new token,
-- so no step is written by an attempt whose lease another attempt already holds.

-- name: step_list
-- A job's steps (intents and outcomes), in the order they were first intended.
SELECT s.name, s.attempt, s.lease_token, s.intended_at, s.finished_at, s.result, s.note,
       s.resolved_by, s.resolved_at, s.resolve_reason
  FROM leaseq.job_steps s
 WHERE s.job_id = %(id)s
 ORDER BY s.intended_at NULLS LAST, s.name;

-- name: step_intend
-- Commits the held attempt's intent to run a step: a new row, or the step's row without an outcome whose intent is %(seen_token)s (the one the attempt saw; NULL: none); no row when the lease is not held.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
held AS (
    SELECT j.id, j.attempt_count, j.lease_token FROM leaseq.jobs j, t
     WHERE j.id = %(id)s AND j.lease_owner = %(owner)s AND j.lease_token = %(token)s
       AND j.lease_digest = sha256(%(secret)s::bytea)
       AND j.lease_expires_at > t.now
       FOR SHARE OF j
)
INSERT INTO leaseq.job_steps AS s (job_id, name, attempt, lease_token, intended_at)
SELECT held.id, %(name)s, held.attempt_count, held.lease_token, t.now FROM held, t
ON CONFLICT (job_id, name) DO UPDATE
   SET attempt = excluded.attempt, lease_token = excluded.lease_token,
       intended_at = excluded.intended_at
 WHERE s.finished_at IS NULL AND s.lease_token IS NOT DISTINCT FROM %(seen_token)s::bigint
RETURNING s.intended_at;

-- name: step_record
-- Records the outcome of a step the held attempt intended; no row when the lease is not held.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
held AS (
    SELECT j.id FROM leaseq.jobs j, t
     WHERE j.id = %(id)s AND j.lease_owner = %(owner)s AND j.lease_token = %(token)s
       AND j.lease_digest = sha256(%(secret)s::bytea)
       AND j.lease_expires_at > t.now
       FOR SHARE OF j
)
UPDATE leaseq.job_steps s
   SET finished_at = t.now, result = %(result)s, note = %(note)s
  FROM held, t
 WHERE s.job_id = held.id AND s.name = %(name)s AND s.lease_token = %(token)s
   AND s.finished_at IS NULL
RETURNING s.finished_at;

-- name: step_withdraw
-- Withdraws the held attempt's intent of a step whose function raised (known not done); no row when the lease is not held.
WITH held AS (
    SELECT j.id FROM leaseq.jobs j
     WHERE j.id = %(id)s AND j.lease_owner = %(owner)s AND j.lease_token = %(token)s
       AND j.lease_digest = sha256(%(secret)s::bytea)
       AND j.lease_expires_at > coalesce(%(now)s::timestamptz, now())
       FOR SHARE OF j
)
UPDATE leaseq.job_steps s
   SET attempt = NULL, lease_token = NULL, intended_at = NULL
  FROM held
 WHERE s.job_id = held.id AND s.name = %(name)s AND s.lease_token = %(token)s
   AND s.finished_at IS NULL
RETURNING s.name;

-- name: step_resolve
-- Settles an uncertain step of a dead job (leaseq.step_resolve, steps.sql): records %(result)s as its outcome, or with %(retry)s clears the intent so the step runs again; says who, when and why; and brings the job back to pending with a fresh budget of attempts, in one statement.
SELECT id, notified
  FROM leaseq.step_resolve(%(id)s, %(name)s, %(result)s::jsonb, %(retry)s, %(actor)s, %(reason)s,
                           %(now)s::timestamptz);

-- name: steps_uncertain
-- Dead jobs stopped at an uncertain step (an intent without an outcome), oldest first, up to %(limit)s.
SELECT j.id AS job_id, j.queue, j.job_type, s.name, s.attempt, s.intended_at
  FROM leaseq.jobs j
  JOIN leaseq.job_steps s ON s.job_id = j.id
 WHERE j.status = 'dead' AND j.last_error_code = %(error_code)s
   AND s.finished_at IS NULL AND s.lease_token IS NOT NULL
 ORDER BY j.id, s.name
 LIMIT %(limit)s;
