-- Named statements that act on several jobs at once, loaded with the rest by leaseq.statements.

-- name: job_complete_many
-- Marks several held jobs succeeded in one statement, each fenced by its own owner and token; writes each effect through its key and records each attempt.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
req AS (
    SELECT r.id, r.owner, r.token, r.result, r.effect_key
      FROM unnest(%(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[],
                  %(results)s::jsonb[], %(effect_keys)s::text[])
           AS r(id, owner, token, result, effect_key)
),
done AS (
    UPDATE leaseq.jobs j
       SET status = 'succeeded', finished_at = t.now, lease_expires_at = NULL, result = req.result
      FROM t, req
     WHERE j.id = req.id AND j.status = 'running' AND j.lease_owner = req.owner
       AND j.lease_token = req.token AND j.lease_expires_at > t.now
    RETURNING j.id, j.attempt_count, j.lease_token, j.lease_owner, j.started_at, j.finished_at,
              coalesce(req.effect_key, j.idempotency_key, 'job:' || j.id) AS effect_key,
              req.result
),
effect AS (
    INSERT INTO leaseq.job_results (idempotency_key, job_id, produced_by, produced_at, result)
    SELECT done.effect_key, done.id, done.lease_owner, done.finished_at,
           coalesce(done.result, 'null'::jsonb)
      FROM done
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING job_id
),
attempt AS (
    INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome)
    SELECT done.id, done.attempt_count, done.lease_token, done.lease_owner, done.started_at,
           done.finished_at, 'succeeded'
      FROM done
)
SELECT done.id, done.effect_key,
       EXISTS (SELECT 1 FROM effect e WHERE e.job_id = done.id) AS effect_written
  FROM done;
