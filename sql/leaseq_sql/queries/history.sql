-- Named statements of the history: the leader's mover and retention, the ledger, the rollup
-- and the one lookup that answers for a job wherever it is.

-- name: history_move
-- Moves one batch of jobs finished more than hot_retention seconds ago out of leaseq.jobs, with their attempts, into the history (or, already past retention, the ledger only), writes their ledger rows, hourly counts and the mover's total: one statement, each job moved exactly once.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
victims AS (
    SELECT j.id FROM leaseq.jobs j
     WHERE j.status IN ('succeeded', 'dead', 'cancelled')
       AND j.finished_at < (SELECT now FROM t) - make_interval(secs => %(hot_retention)s)
       -- A parent whose children are unfinished keeps its result where they read it, and a
       -- job of an unfinished pipeline stays until the pipeline finishes (migration 0012).
       AND NOT (j.has_children AND EXISTS (
               SELECT 1 FROM leaseq.job_deps d JOIN leaseq.jobs c ON c.id = d.child_id
                WHERE d.parent_id = j.id AND c.finished_at IS NULL))
       AND NOT (j.pipeline_id IS NOT NULL AND EXISTS (
               SELECT 1 FROM leaseq.pipelines p
                WHERE p.id = j.pipeline_id AND p.finished_at IS NULL))
     ORDER BY j.finished_at
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM leaseq.jobs j USING victims v WHERE j.id = v.id RETURNING j.*
),
kept AS (
    SELECT m.*, k.keep_days,
           (m.finished_at AT TIME ZONE 'UTC')::date + 1 + k.keep_days
               <= ((SELECT now FROM t) AT TIME ZONE 'UTC')::date AS expired
      FROM moved m
      -- No rule (the '*' rows deleted by hand): keep_days NULL fails the whole batch.
      LEFT JOIN LATERAL (
          SELECT r.keep_days FROM leaseq.history_retention r
           WHERE r.status = m.status AND r.queue IN (m.queue, '*')
           ORDER BY r.queue = '*' LIMIT 1
      ) k ON true
),
attempts AS (
    DELETE FROM leaseq.job_attempts a USING moved m WHERE a.job_id = m.id RETURNING a.*
),
-- A moved job's edges to its parents (nothing reads them once it has finished).
edges AS (DELETE FROM leaseq.job_deps d USING moved m WHERE d.child_id = m.id),
history AS (
    INSERT INTO leaseq.job_history (
        id, queue, job_type, payload, status, priority, attempt_count, max_attempts,
        created_at, available_at, started_at, finished_at, lease_owner, lease_token,
        lease_expires_at, heartbeat_at, progress, timeout, last_error, last_error_code,
        idempotency_key, dedup_key, result, checkpoint, claim_id, enqueued_by, notify_done,
        keep_days, moved_at, deps_left, has_children, cancelled_by, pipeline_id, key,
        ordering_key, ordering_seq, ordering_waiting, waiting_for, waiting_since,
        trace_context)
    SELECT id, queue, job_type, payload, status, priority, attempt_count, max_attempts,
           created_at, available_at, started_at, finished_at, lease_owner, lease_token,
           lease_expires_at, heartbeat_at, progress, timeout, last_error, last_error_code,
           idempotency_key, dedup_key, result, checkpoint, claim_id, enqueued_by, notify_done,
           keep_days, (SELECT now FROM t), deps_left, has_children, cancelled_by, pipeline_id,
           key, ordering_key, ordering_seq, ordering_waiting, waiting_for, waiting_since,
           trace_context
      FROM kept WHERE NOT expired
),
attempt_history AS (
    INSERT INTO leaseq.job_attempt_history (
        job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error,
        traceback, finished_at, keep_days)
    SELECT a.job_id, a.attempt, a.lease_token, a.worker, a.started_at, a.ended_at, a.outcome,
           a.error, a.traceback, k.finished_at, k.keep_days
      FROM attempts a JOIN kept k ON k.id = a.job_id
     WHERE NOT k.expired
),
-- Effects of jobs already past their retention go with them (the others stay until their
-- history leaf is dropped: see leaseq.history_expire_step).
effects AS (
    DELETE FROM leaseq.job_results r USING kept k
     WHERE k.expired AND k.idempotency_key IS NOT NULL AND r.queue = k.queue
       AND r.job_type = k.job_type AND r.idempotency_key = k.idempotency_key AND r.job_id = k.id
),
ledger AS (
    INSERT INTO leaseq.job_ledger (id, queue, job_type, status, created_at, finished_at,
                                   attempts, last_error_code, last_error, keep_days, moved_at)
    SELECT id, queue, job_type, status, created_at, finished_at, attempt_count,
           last_error_code, left(last_error, 200), keep_days, (SELECT now FROM t)
      FROM kept
),
counts AS (
    INSERT INTO leaseq.history_counts AS c (queue, status, hour, jobs)
    SELECT queue, status, date_trunc('hour', finished_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
           count(*)
      FROM kept GROUP BY 1, 2, 3
    ON CONFLICT (queue, status, hour) DO UPDATE SET jobs = c.jobs + EXCLUDED.jobs
),
-- The mover's running total, in the statement that moves: a mover killed after its commit
-- cannot leave the total short.
tally AS (
    UPDATE leaseq.history_mover SET moved = moved + (SELECT count(*) FROM kept), updated_at = now()
     WHERE name = 'mover' AND EXISTS (SELECT 1 FROM kept)
)
SELECT count(*) AS moved, count(*) FILTER (WHERE expired) AS expired FROM kept;

-- name: history_mover_state
-- The mover's current batch size and the ledger's retention in days.
SELECT batch, ledger_keep_days FROM leaseq.history_mover WHERE name = 'mover';

-- name: history_mover_record
-- Records what a mover batch did: its batch size from now on and a timeout or not (the jobs it moved are counted by history_move itself).
UPDATE leaseq.history_mover
   SET batch = %(batch)s, timeouts = timeouts + %(timeouts)s, updated_at = now()
 WHERE name = 'mover';

-- name: history_ensure_partitions
-- Creates the missing day partitions (and retention leaves) of the history from the oldest finished job waiting in leaseq.jobs to `ahead` days after now; returns what it created.
SELECT leaseq.history_ensure_partitions(%(ahead)s, coalesce(%(now)s::timestamptz, now())) AS created;

-- name: history_expire_step
-- One retention step: deletes up to `batch` effects of the oldest expired history leaf and drops it once they are gone; no row when nothing has expired.
SELECT leaf, effects, dropped
  FROM leaseq.history_expire_step(coalesce(%(now)s::timestamptz, now()), %(batch)s);

-- name: history_ledger_expire
-- Deletes one batch of ledger rows (and hourly counts) older than the ledger's retention.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) - make_interval(days => m.ledger_keep_days) AS cutoff
      FROM leaseq.history_mover m WHERE m.name = 'mover'
),
victims AS (
    SELECT l.id FROM leaseq.job_ledger l
     WHERE l.finished_at < (SELECT cutoff FROM t)
     ORDER BY l.finished_at LIMIT %(batch)s
),
counts AS (DELETE FROM leaseq.history_counts c WHERE c.hour < (SELECT cutoff FROM t)),
deleted AS (DELETE FROM leaseq.job_ledger l USING victims v WHERE l.id = v.id RETURNING l.id)
SELECT count(*) AS deleted FROM deleted;

-- name: history_retention_list
-- The retention rules (queue '*' is every queue without a rule of its own) and the ledger's retention.
SELECT r.queue, r.status::text AS status, r.keep_days,
       (SELECT ledger_keep_days FROM leaseq.history_mover WHERE name = 'mover') AS ledger_keep_days
  FROM leaseq.history_retention r
 ORDER BY r.queue = '*' DESC, r.queue, r.status;

-- name: history_retention_set
-- Sets how many days moved jobs of one queue ('*': every queue) and final state stay in history.
INSERT INTO leaseq.history_retention (queue, status, keep_days)
VALUES (%(queue)s, %(status)s, %(keep_days)s)
ON CONFLICT (queue, status) DO UPDATE SET keep_days = EXCLUDED.keep_days
RETURNING keep_days;

-- name: history_retention_unset
-- Removes one queue's own rule (its jobs then follow the '*' rule); the '*' rules cannot be removed.
DELETE FROM leaseq.history_retention
 WHERE queue = %(queue)s AND queue <> '*' AND status = %(status)s
RETURNING keep_days;

-- name: history_ledger_retention_set
-- Sets how many days ledger rows (and hourly counts) are kept.
UPDATE leaseq.history_mover SET ledger_keep_days = %(keep_days)s WHERE name = 'mover'
RETURNING ledger_keep_days;

-- name: history_counts
-- Finished jobs per queue and final state since a time, from the hourly rollup (moved jobs) plus the hot table's finished rows: never a count over history.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(since)s) AS since)
SELECT queue, status, sum(jobs)::bigint AS jobs
  FROM (
      SELECT c.queue, c.status::text AS status, c.jobs
        FROM leaseq.history_counts c
       WHERE c.hour >= date_trunc('hour', (SELECT since FROM t) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
         AND (%(queue)s::text IS NULL OR c.queue = %(queue)s::text)
      UNION ALL
      SELECT j.queue, j.status::text, count(*)
        FROM leaseq.jobs j
       WHERE j.status IN ('succeeded', 'dead', 'cancelled') AND j.finished_at >= (SELECT since FROM t)
         AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
       GROUP BY 1, 2
  ) s
 GROUP BY queue, status
 ORDER BY queue, status;

-- name: history_waiting
-- Finished jobs in leaseq.jobs, and how many of them finished more than hot_retention seconds ago (what the mover will move).
SELECT count(*) AS finished,
       count(*) FILTER (WHERE j.finished_at < now() - make_interval(secs => %(hot_retention)s)) AS due
  FROM leaseq.jobs j
 WHERE j.status IN ('succeeded', 'dead', 'cancelled');

-- name: job_whereabouts
-- One job by id wherever it is: the hot table, the history, or only the ledger (place says which).
SELECT * FROM leaseq.job_whereabouts WHERE id = %(id)s;

-- name: job_attempts_anywhere
-- Every recorded attempt of one job, in the hot table or in history, oldest first.
SELECT a.job_id, a.attempt, a.lease_token, a.worker, a.started_at, a.ended_at,
       a.outcome::text AS outcome, a.error, a.traceback
  FROM leaseq.job_attempts a
 WHERE a.job_id = %(id)s
UNION ALL
SELECT a.job_id, a.attempt, a.lease_token, a.worker, a.started_at, a.ended_at,
       a.outcome::text, a.error, a.traceback
  FROM leaseq.job_ledger l
  -- LATERAL with OFFSET 0: the ledger's values prune the history to one partition.
  CROSS JOIN LATERAL (
      SELECT * FROM leaseq.job_attempt_history x
       WHERE x.job_id = l.id AND x.finished_at = l.finished_at AND x.keep_days = l.keep_days
      OFFSET 0
  ) a
 WHERE l.id = %(id)s
 ORDER BY lease_token;

-- name: job_prune_preview
-- What job_prune would delete: finished jobs per status that finished before the cutoff.
SELECT j.status::text AS status, count(*) AS jobs, min(j.finished_at) AS oldest,
       max(j.finished_at) AS newest
  FROM leaseq.jobs j
 WHERE j.status = ANY(%(statuses)s::leaseq.job_status[])
   AND j.status IN ('succeeded', 'dead', 'cancelled')
   AND j.finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)
 GROUP BY j.status
 ORDER BY j.status;
