-- Named statements of durable steps (ctx.step): a handler's intent and outcome, each fenced
-- by the attempt's lease in one statement of the worker's door (definitions/lease.sql), and
-- an operator's resolution of an uncertain step.

-- name: step_list
-- A job's steps (intents and outcomes), in the order they were first intended.
SELECT s.name, s.attempt, s.lease_token, s.intended_at, s.finished_at, s.result, s.note,
       s.resolved_by, s.resolved_at, s.resolve_reason
  FROM leaseq.job_steps s
 WHERE s.job_id = %(id)s
 ORDER BY s.intended_at NULLS LAST, s.name;

-- name: step_intend
-- Commits the held attempt's intent to run a step (leaseq.lease_step_intend): a new row, or the step's row without an outcome whose intent is %(seen_token)s (the one the attempt saw; NULL: none); no row when the lease is not held.
SELECT s.intended_at
  FROM leaseq.lease_step_intend(%(id)s, %(owner)s, %(token)s, %(secret)s, %(name)s,
                                %(seen_token)s::bigint, %(now)s::timestamptz) s;

-- name: step_record
-- Records the outcome of a step the held attempt intended (leaseq.lease_step_record); no row when the lease is not held.
SELECT s.finished_at
  FROM leaseq.lease_step_record(%(id)s, %(owner)s, %(token)s, %(secret)s, %(name)s,
                                %(result)s::jsonb, %(note)s, %(now)s::timestamptz) s;

-- name: step_withdraw
-- Withdraws the held attempt's intent of a step whose function raised (known not done; leaseq.lease_step_withdraw); no row when the lease is not held.
SELECT s.name
  FROM leaseq.lease_step_withdraw(%(id)s, %(owner)s, %(token)s, %(secret)s, %(name)s,
                                  %(now)s::timestamptz) s;

-- name: step_resolve
-- Settles an uncertain step of a held job (or of a dead one stopped there before held existed) (leaseq.step_resolve, steps.sql): records %(result)s as its outcome, or with %(retry)s clears the intent so the step runs again; says who, when and why; and brings the job back to pending with a fresh budget of attempts, in one statement.
SELECT id, notified
  FROM leaseq.step_resolve(%(id)s, %(name)s, %(result)s::jsonb, %(retry)s, %(actor)s, %(reason)s,
                           %(now)s::timestamptz);

-- name: steps_uncertain
-- Jobs held at an uncertain step (an intent without an outcome; or dead there, stopped before held existed), oldest first, up to %(limit)s.
SELECT j.id AS job_id, j.queue, j.job_type, s.name, s.attempt, s.intended_at
  FROM leaseq.jobs j
  JOIN leaseq.job_steps s ON s.job_id = j.id
 WHERE ((j.status = 'held' AND j.finished_at IS NULL
          AND j.status NOT IN ('waiting', 'pending', 'running'))  -- jobs_held_idx's predicate
        OR j.status = 'dead')
   AND j.last_error_code = %(error_code)s
   AND s.finished_at IS NULL AND s.lease_token IS NOT NULL
 ORDER BY j.id, s.name
 LIMIT %(limit)s;
