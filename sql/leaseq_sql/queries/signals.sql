-- Named statements of signals (ctx.wait_for, Queue.signal; docs/concepts/waits.md).
--
-- The hand-back of a job waiting for a signal is one short transaction of two statements:
-- job_wait_lock locks the held job's row, then job_wait (a fresh snapshot, taken after the
-- lock) looks for the signal and hands the job back. A signal's insert locks the same row
-- first (definitions/signals.sql), so whichever comes second sees what the first committed.

-- name: job_signal
-- Sends signal %(name)s with %(payload)s to job %(id)s through leaseq.signal (as the caller: a producer only to its own jobs): whether it was stored (the first under its name is kept) and whether the job was waiting for it (then claimable now).
SELECT s.stored, s.waiting FROM leaseq.signal(%(id)s, %(name)s, %(payload)s) s;

-- name: signal_read
-- The signal %(name)s of a job the caller holds: found, its payload; no row when the lease is not held.
WITH held AS (
    SELECT j.id FROM leaseq.jobs j
     WHERE j.id = %(id)s AND j.lease_owner = %(owner)s AND j.lease_token = %(token)s
       AND j.lease_digest = sha256(%(secret)s::bytea)
       AND j.lease_expires_at > coalesce(%(now)s::timestamptz, now())
)
SELECT s.job_id IS NOT NULL AS found, s.payload
  FROM held
  LEFT JOIN leaseq.job_signals s ON s.job_id = held.id AND s.name = %(name)s;

-- name: job_wait_lock
-- Locks the row of a job the caller holds, the first statement of its hand-back to wait for a signal (job_wait follows in the same transaction); no row when the lease is not held.
SELECT j.id FROM leaseq.jobs j
 WHERE j.id = %(id)s AND j.lease_owner = %(owner)s AND j.lease_token = %(token)s
   AND j.lease_digest = sha256(%(secret)s::bytea)
   AND j.lease_expires_at > coalesce(%(now)s::timestamptz, now())
   FOR UPDATE;

-- name: job_wait
-- A handler waiting for signal %(name)s (ctx.wait_for), after job_wait_lock: hands the held job back without spending an attempt, claimable at %(until)s (database time) or at once if the signal is there, showing what it waits for and since when; token bumped, its key's unit given back by the status trigger; the attempt recorded as released.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
sent AS (
    SELECT EXISTS (SELECT 1 FROM leaseq.job_signals s
                    WHERE s.job_id = %(id)s AND s.name = %(name)s) AS there
),
waited AS (
    UPDATE leaseq.jobs j
       SET status = 'pending',
           available_at = CASE WHEN sent.there THEN t.now
                               ELSE greatest(t.now, %(until)s::timestamptz) END,
           waiting_for = %(name)s, waiting_since = t.now,
           attempt_count = j.attempt_count - 1,
           lease_token = j.lease_token + 1, lease_expires_at = NULL,
           started_at = NULL, heartbeat_at = NULL
      FROM t, sent
     WHERE j.id = %(id)s AND j.lease_owner = %(owner)s
       AND j.lease_token = %(token)s AND j.lease_digest = sha256(%(secret)s::bytea)
       AND j.lease_expires_at > t.now
    RETURNING j.id, j.queue, j.available_at, j.attempt_count + 1 AS attempt, sent.there
),
attempt AS (
    INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
    SELECT w.id, w.attempt, %(token)s, %(owner)s, %(started_at)s, t.now, 'released',
           CASE WHEN w.there THEN 'signal ' || quote_literal(%(name)s) || ' arrived while handing back'
                ELSE 'waiting for signal ' || quote_literal(%(name)s) || ' until ' || w.available_at END
      FROM waited w, t
),
-- The signal came first: claimable now, so say so.
woke AS (SELECT pg_notify('leaseq_jobs', w.queue) FROM waited w WHERE w.there)
SELECT w.id, 'pending' AS status, w.available_at, w.there AS signalled,
       (SELECT count(*) FROM woke) AS notified
  FROM waited w;

-- name: job_waiting_on
-- What a pending job waits for (ctx.wait_for) and since when, and its deadline; no row when it waits for no signal.
SELECT j.waiting_for, j.waiting_since, j.available_at AS deadline
  FROM leaseq.jobs j
 WHERE j.id = %(id)s AND j.status = 'pending' AND j.waiting_for IS NOT NULL;

-- name: signal_list
-- The signals sent to a job (name, when, by whom, payload size), oldest first, at most %(limit)s.
SELECT s.name, s.sent_at, s.sent_by, octet_length(s.payload::text) AS bytes
  FROM leaseq.job_signals s
 WHERE s.job_id = %(id)s
 ORDER BY s.sent_at, s.name
 LIMIT %(limit)s;

-- name: queue_signal_waits
-- Jobs waiting for a signal per queue and the age of the oldest wait: a scan of the small jobs_signal_wait_idx (queue, waiting_since) only.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT j.queue, count(*) AS waiting,
       -- Ages only from finite past times: -infinity would be no number of seconds (and
       -- PostgreSQL before 17 refuses to subtract it), a future time no age at all.
       extract(epoch FROM t.now - min(j.waiting_since) FILTER (
           WHERE isfinite(j.waiting_since) AND j.waiting_since <= t.now))::float8 AS oldest_age
  FROM leaseq.jobs j, t
 WHERE j.status = 'pending' AND j.waiting_for IS NOT NULL
   AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
 GROUP BY j.queue, t.now
 ORDER BY j.queue;
