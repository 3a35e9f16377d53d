-- Named statements on leaseq.jobs, loaded once by leaseq.statements.
-- Each block: `-- name: NAME`, one line saying what it does, then the statement.
-- Time-dependent statements take %(now)s: NULL means database time (always, in production).
--
-- The fenced statements (heartbeats, checkpoint, complete, fail, release, sleep) call the
-- worker's door, definitions/lease.sql: each holds a lease when owner, token, the lease's
-- secret and an unexpired lease_expires_at match, and says nothing of the status: a lease
-- exists only while a job runs (CHECK jobs_lease_only_while_running, migration 0014).
-- Naming status = 'running' would let the planner prefer the partial jobs_running_idx over
-- the primary key whenever the statistics predate the running jobs (test_fenced_plans.py).

-- name: job_enqueue
-- Inserts one pending job, flagged notify_done when %(wait)s (or finds the unfinished job with the same dedup key), and wakes listeners on commit.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
ins AS (
    INSERT INTO leaseq.jobs (queue, job_type, payload, priority, max_attempts, available_at,
                             timeout, idempotency_key, dedup_key, created_at, notify_done, key,
                             ordering_key, trace_context)
    SELECT %(queue)s, %(job_type)s, %(payload)s, %(priority)s, %(max_attempts)s,
           coalesce(%(run_at)s::timestamptz, t.now + make_interval(secs => %(delay)s)),
           make_interval(secs => %(timeout)s), %(idempotency_key)s, %(dedup_key)s, t.now,
           %(wait)s, %(key)s, %(ordering_key)s, %(trace_context)s::jsonb
      FROM t
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO NOTHING
    RETURNING id, queue
),
woke AS (SELECT pg_notify('leaseq_jobs', ins.queue) FROM ins)
SELECT ins.id, true AS created, (SELECT count(*) FROM woke) AS notified FROM ins
UNION ALL
SELECT j.id, false, 0 FROM leaseq.jobs j
 WHERE NOT EXISTS (SELECT 1 FROM ins)
   AND j.queue = %(queue)s AND j.dedup_key = %(dedup_key)s AND j.status IN ('pending', 'running');

-- name: job_claim
-- Leases up to %(limit)s ready jobs from the given queues (of %(job_types)s only, unless NULL) in priority order, skipping rows other claimers hold (leaseq.lease_claim, definitions/claims.sql); bumps attempt and token.
SELECT c.*
  FROM leaseq.lease_claim(%(queues)s::text[], %(job_types)s::text[], %(owner)s, %(limit)s,
                         %(lease_seconds)s, %(claim_id)s, %(claim_secret)s, %(now)s::timestamptz) c;

-- name: job_claim_recover
-- The jobs the given claim calls (%(claim_ids)s, each with its claim secret in %(claim_secrets)s) took and the owner still holds, in the claim's shape with the claim's id: the answer to claims whose reply was lost with their connection.
-- A claim's id is readable by every worker; only its secret matches the digests it wrote.
SELECT j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
       j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
       extract(epoch FROM j.timeout)::float8 AS timeout_seconds, j.idempotency_key, j.checkpoint,
       j.trace_context, j.claim_id
  FROM leaseq.jobs j
  JOIN unnest(%(claim_ids)s::uuid[], %(claim_secrets)s::bytea[]) AS c(claim_id, secret)
    ON c.claim_id = j.claim_id
 WHERE j.status = 'running' AND j.lease_owner = %(owner)s
   AND j.claim_id = ANY(%(claim_ids)s::uuid[])
   AND j.lease_digest = sha256(c.secret)
 ORDER BY j.priority, j.available_at, j.id;

-- name: job_heartbeat_many
-- Extends held leases (one or many) in one statement (leaseq.lease_heartbeat_many), each fenced by its own owner, token and secret and capped at the job's max runtime, storing each one's progress; returns the ids and new lease ends of those still held (a missing id's lease is lost).
SELECT h.id, h.lease_expires_at
  FROM leaseq.lease_heartbeat_many(%(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[],
                                   %(secrets)s::bytea[], %(progresses)s::jsonb[],
                                   %(lease_seconds)s, %(now)s::timestamptz) h;

-- name: job_checkpoint
-- Stores durable handler state for the next attempt, only for the current lease holder (leaseq.lease_checkpoint).
SELECT c.id
  FROM leaseq.lease_checkpoint(%(id)s, %(owner)s, %(token)s, %(secret)s, %(checkpoint)s::jsonb,
                               %(now)s::timestamptz) c;

-- name: job_complete
-- Marks held jobs succeeded (one or a batch, each fenced by its own owner, token and secret), writes an effect for each job with a key within the job's queue and type, and records each attempt, in one statement (leaseq.lease_complete, definitions/lease.sql).
SELECT c.id, c.effect_key, c.effect_written
  FROM leaseq.lease_complete(%(ids)s::bigint[], %(owners)s::text[], %(tokens)s::bigint[],
                             %(secrets)s::bytea[], %(results)s::jsonb[], %(effect_keys)s::text[],
                             %(progresses)s::jsonb[], %(notes)s::text[], %(now)s::timestamptz) c;

-- name: job_fail
-- Ends a held attempt with an error (leaseq.lease_fail): back to pending after backoff if retryable with attempts left, else dead; records the attempt with its traceback, if any.
SELECT f.id, f.status, f.available_at
  FROM leaseq.lease_fail(%(id)s, %(owner)s, %(token)s, %(secret)s, %(error)s, %(error_code)s,
                         %(traceback)s, %(retryable)s, %(outcome)s::leaseq.attempt_outcome,
                         %(backoff_base)s, %(backoff_cap)s, %(now)s::timestamptz) f;

-- name: job_release
-- Gives a held job back, keeping its place in the queue (leaseq.lease_release). A shutdown release (%(shutdown)s) does not count the attempt; any other (a handler raising Interrupted) counts it: retried after backoff, or dead when attempts are used up. Token bumped; wakes listeners.
SELECT r.id, r.status, r.available_at, r.notified
  FROM leaseq.lease_release(%(id)s, %(owner)s, %(token)s, %(secret)s, %(started_at)s::timestamptz,
                            %(reason)s, %(shutdown)s, %(backoff_base)s, %(backoff_cap)s,
                            %(now)s::timestamptz) r;

-- name: job_sleep
-- A handler sleeping durably (ctx.sleep): hands a held job back without spending an attempt, claimable again at %(until)s (leaseq.lease_sleep); token bumped; the attempt is recorded as released with the wake time.
SELECT s.id, s.status, s.available_at
  FROM leaseq.lease_sleep(%(id)s, %(owner)s, %(token)s, %(secret)s, %(started_at)s::timestamptz,
                          %(until)s::timestamptz, %(now)s::timestamptz) s;

-- name: job_record_fenced
-- Records that a worker call was refused because the caller no longer holds the lease (leaseq.lease_refused: a reaped attempt becomes fenced; a cancelled or finished one keeps its outcome; at the current token only the secret's holder is recorded); returns the job's status (NULL when the job does not exist).
SELECT r.status, r.recorded
  FROM leaseq.lease_refused(%(id)s, %(owner)s, %(token)s, %(secret)s, %(attempt)s,
                            %(started_at)s::timestamptz, %(call)s, %(now)s::timestamptz) r;

-- name: job_reap
-- Returns up to %(limit)s running jobs whose lease has expired (or, given %(owners)s, every running job those owners hold: workers known dead) to pending in their old place (the lease was the backoff), or dead when attempts are exhausted; records each attempt and which reaper (%(reaper)s) took it.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
expired AS (
    SELECT j.id, j.lease_owner, j.lease_token, j.attempt_count, j.started_at,
           (j.timeout IS NOT NULL AND j.started_at + least(j.timeout, interval '100 years') <= t.now) AS timed_out
      FROM leaseq.jobs j, t
     WHERE j.status = 'running'
       AND CASE WHEN %(owners)s::text[] IS NULL THEN j.lease_expires_at <= t.now
                ELSE j.lease_owner = ANY(%(owners)s::text[]) END
     ORDER BY j.lease_expires_at
     LIMIT %(limit)s
       FOR UPDATE OF j SKIP LOCKED
),
reaped AS (
    UPDATE leaseq.jobs j
       SET status = CASE WHEN j.attempt_count >= j.max_attempts
                         THEN 'dead' ELSE 'pending' END::leaseq.job_status,
           finished_at = CASE WHEN j.attempt_count >= j.max_attempts THEN t.now END,
           lease_owner = CASE WHEN j.attempt_count >= j.max_attempts THEN j.lease_owner END,
           lease_expires_at = NULL,
           last_error = CASE WHEN e.timed_out THEN 'timed out'
                             WHEN %(owners)s::text[] IS NULL THEN 'lease expired'
                             ELSE 'lease ended: its worker terminated' END
                        || ' (owner ' || e.lease_owner || ', token ' || e.lease_token || ')',
           last_error_code = CASE WHEN e.timed_out THEN 'TIMED_OUT' ELSE 'LEASE_EXPIRED' END
      FROM expired e, t
     WHERE j.id = e.id
    RETURNING j.id, j.queue, j.job_type, j.status, j.available_at, e.lease_owner, e.lease_token,
              e.attempt_count, e.started_at, e.timed_out
),
attempt AS (
    INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
    SELECT r.id, r.attempt_count, r.lease_token, r.lease_owner, r.started_at, t.now,
           CASE WHEN r.timed_out THEN 'timed_out' ELSE 'lease_expired' END::leaseq.attempt_outcome,
           CASE WHEN %(owners)s::text[] IS NULL THEN 'lease expired without completion'
                ELSE 'lease ended without completion: its worker terminated' END
           || coalesce(' (reaped by ' || %(reaper)s::text || ')', '')
      FROM reaped r, t
    ON CONFLICT (job_id, lease_token) DO NOTHING
)
SELECT r.id, r.queue, r.job_type, r.status::text AS status, r.lease_owner, r.lease_token,
       r.attempt_count, r.timed_out
  FROM reaped r;

-- name: job_attempt_outcome
-- How one attempt (job and lease token) ended, if it has: settles a call whose commit was lost with its connection. With the job's status and retry time, and the effect that attempt wrote, if any.
SELECT a.outcome::text AS outcome, j.status::text AS status, j.available_at,
       r.idempotency_key AS effect_key, r.idempotency_key IS NOT NULL AS effect_written
  FROM leaseq.job_attempts a
  JOIN leaseq.jobs j ON j.id = a.job_id
  LEFT JOIN leaseq.job_results r
         ON r.job_id = a.job_id AND r.produced_by = a.worker AND r.produced_at = a.ended_at
        AND a.outcome = 'succeeded'
 WHERE a.job_id = %(id)s AND a.lease_token = %(token)s;

-- name: job_cancel
-- Cancels a job (waiting, pending or running: a running holder is fenced from then on) with every unfinished descendant, as the caller's role may (leaseq.cancel_as_caller: a producer only its own); returns each job cancelled, its previous status and the job named (ancestor).
SELECT c.id, c.previous_status, c.ancestor
  FROM leaseq.cancel_as_caller(%(id)s::bigint, NULL, %(reason)s, coalesce(%(now)s::timestamptz, now())) c;

-- name: job_retry_dead
-- Brings a dead job back to pending now with a fresh budget of attempts, keeping its id, token and attempt history; a wait it died of (WaitTimedOut) starts afresh (leaseq.retry_dead, steps.sql).
WITH revived AS (
    SELECT r.id, r.queue, r.max_attempts
      FROM leaseq.retry_dead(ARRAY[%(id)s]::bigint[], %(attempts)s, %(now)s::timestamptz) r
),
woke AS (SELECT pg_notify('leaseq_jobs', revived.queue) FROM revived)
SELECT revived.id, revived.max_attempts, (SELECT count(*) FROM woke) AS notified FROM revived;

-- name: job_prune
-- Deletes one batch of finished jobs (and their attempts) that finished before the cutoff; effects in job_results are kept.
WITH victims AS (
    SELECT j.id FROM leaseq.jobs j
     WHERE j.status = ANY(%(statuses)s::leaseq.job_status[])
       AND j.status IN ('succeeded', 'dead', 'cancelled')
       AND j.finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)
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
attempts AS (DELETE FROM leaseq.job_attempts a USING victims v WHERE a.job_id = v.id),
edges AS (DELETE FROM leaseq.job_deps d USING victims v WHERE d.child_id = v.id),
deleted AS (DELETE FROM leaseq.jobs j USING victims v WHERE j.id = v.id RETURNING j.id)
SELECT count(*) AS deleted FROM deleted;

-- name: queue_stats
-- Per-queue depth for dashboards and the operator: ready, scheduled (and due within the horizon), running, dead, held, oldest ready age, max heartbeat age.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
pending AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.available_at <= t.now) AS ready,
           count(*) FILTER (WHERE j.available_at > t.now) AS scheduled,
           count(*) FILTER (WHERE j.available_at > t.now
                              AND j.available_at <= t.now + make_interval(secs => %(horizon)s)) AS scheduled_soon,
           -- Ages only from finite times: a job due at -infinity counts as ready but adds no
           -- age (an infinite one would be no number of seconds, and PostgreSQL before 17
           -- refuses to subtract it).
           extract(epoch FROM t.now - min(j.available_at) FILTER (WHERE j.available_at <= t.now
                                                                   AND isfinite(j.available_at)))::float8
               AS oldest_ready_age
      FROM leaseq.jobs j, t
     WHERE j.status = 'pending'
     GROUP BY j.queue, t.now
),
running AS (
    SELECT j.queue, count(*) AS running,
           extract(epoch FROM t.now - min(j.heartbeat_at) FILTER (WHERE isfinite(j.heartbeat_at)))::float8
               AS max_heartbeat_age
      FROM leaseq.jobs j, t
     WHERE j.status = 'running'
     GROUP BY j.queue, t.now
),
dead AS (
    SELECT j.queue, count(*) AS dead FROM leaseq.jobs j WHERE j.status = 'dead' GROUP BY j.queue
),
held AS (
    -- Stopped at an uncertain step, waiting for a human. The predicate is jobs_held_idx's
    -- (only a held job is unfinished in none of these statuses; see migration 51).
    SELECT j.queue, count(*) AS held FROM leaseq.jobs j
     WHERE j.status = 'held' AND j.finished_at IS NULL
       AND j.status NOT IN ('waiting', 'pending', 'running')
     GROUP BY j.queue
)
SELECT queue,
       coalesce(p.ready, 0) AS ready, coalesce(p.scheduled, 0) AS scheduled,
       coalesce(p.scheduled_soon, 0) AS scheduled_soon, coalesce(r.running, 0) AS running,
       coalesce(d.dead, 0) AS dead, coalesce(h.held, 0) AS held, p.oldest_ready_age,
       r.max_heartbeat_age
  FROM pending p
  FULL JOIN running r USING (queue)
  FULL JOIN dead d USING (queue)
  FULL JOIN held h USING (queue)
 WHERE %(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[])
 ORDER BY queue;

-- name: unserved_ready
-- Ready jobs per queue and job type that no live worker serves although the queue has live workers (registry heartbeat within %(live_seconds)s): every one lists its job types without this one.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
live AS (
    SELECT w.queues, w.job_types
      FROM leaseq.workers w, t
     WHERE w.heartbeat_at >= t.now - make_interval(secs => %(live_seconds)s)
),
ready AS (
    SELECT j.queue, j.job_type, count(*) AS ready,
           extract(epoch FROM t.now - min(j.available_at) FILTER (WHERE isfinite(j.available_at)))::float8
               AS oldest_ready_age
      FROM leaseq.jobs j, t
     WHERE j.status = 'pending' AND j.available_at <= t.now
       AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
     GROUP BY j.queue, j.job_type, t.now
)
SELECT r.queue, r.job_type, r.ready, r.oldest_ready_age
  FROM ready r
 WHERE EXISTS (SELECT 1 FROM live l WHERE r.queue = ANY(l.queues))
   AND NOT EXISTS (SELECT 1 FROM live l
                    WHERE r.queue = ANY(l.queues)
                      AND (l.job_types IS NULL OR r.job_type = ANY(l.job_types)))
 ORDER BY r.queue, r.job_type;

-- name: queue_finished
-- Per queue, jobs that succeeded or were cancelled within the last %(window)s seconds: a range of jobs_finished_idx, bounded by the window, never a count over all history.
SELECT j.queue,
       count(*) FILTER (WHERE j.status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled
  FROM leaseq.jobs j
 WHERE j.status IN ('succeeded', 'cancelled')
   AND j.finished_at > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(window)s)
   AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
 GROUP BY j.queue
 ORDER BY j.queue;

-- name: job_get
-- One job row by id, whatever its status.
SELECT * FROM leaseq.job_view WHERE id = %(id)s;

-- name: job_list
-- Jobs filtered by status and queue (either may be NULL for all), newest first.
SELECT * FROM leaseq.job_view
 WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: job_attempts
-- Every recorded attempt of one job, oldest first: the job's audit trail.
SELECT a.job_id, a.attempt, a.lease_token, a.worker, a.started_at, a.ended_at,
       a.outcome::text AS outcome, a.error, a.traceback
  FROM leaseq.job_attempts a
 WHERE a.job_id = %(id)s
 ORDER BY a.lease_token;

-- name: job_result
-- The effects written under one idempotency key, in the given queue and job type (either NULL for any), newest first, at most two.
SELECT r.idempotency_key, r.job_id, r.produced_by, r.produced_at, r.result, r.queue, r.job_type
  FROM leaseq.job_results r
 WHERE r.idempotency_key = %(key)s
   AND (%(queue)s::text IS NULL OR r.queue = %(queue)s::text)
   AND (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s::text)
 ORDER BY r.produced_at DESC
 LIMIT 2;

-- name: claim_dead_tuples
-- Dead row versions by the statistics system (what VACUUM would clean up) in each table whose index a claim walks from its head: leaseq.jobs (the claim index) and leaseq.flow_keys (the keyed claim's turn order, where keys that went idle leave dead entries); whether this session's role may VACUUM it, and the role.
-- May VACUUM: as (a member of) the table's owner or the database's owner, or, from
-- PostgreSQL 17, with MAINTAIN on the table. Anyone else's VACUUM only warns and skips the
-- table (checked on PostgreSQL 15 and 18: a database owner's VACUUM runs on both, without
-- MAINTAIN). CASE: MAINTAIN is no privilege before 17, and must not be asked about there.
SELECT t.name AS table_name, coalesce(s.n_dead_tup, 0) AS dead_tuples,
       pg_has_role(c.relowner, 'USAGE')
       OR (SELECT pg_has_role(d.datdba, 'USAGE') FROM pg_database d
            WHERE d.datname = current_database())
       OR CASE WHEN current_setting('server_version_num')::int >= 170000
               THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS may_vacuum,
       current_user AS role
  FROM (VALUES ('jobs'), ('flow_keys')) AS t(name)
  JOIN pg_class c ON c.relnamespace = 'leaseq'::regnamespace AND c.relname = t.name
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid;

-- name: flow_keys_vacuum
-- Vacuums leaseq.flow_keys including its indexes (the keyed claim's turn index), skipping it when another vacuum holds it; outside any transaction.
VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) leaseq.flow_keys;

-- name: jobs_vacuum
-- Vacuums leaseq.jobs including its indexes (AUTO would skip them when few heap pages changed, leaving the claim index's dead head), skipping it when another vacuum holds it; outside any transaction.
VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) leaseq.jobs;
