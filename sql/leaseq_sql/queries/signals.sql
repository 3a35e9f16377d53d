-- Named statements of signals (ctx.wait_for, Queue.signal; docs/concepts/waits.md).
--
-- The hand-back of a job waiting for a signal is leaseq.lease_wait (definitions/lease.sql):
-- it locks the held job's row, then (a fresh snapshot, taken after the lock) looks for the
-- signal and hands the job back. A signal's insert locks the same row first
-- (definitions/signals.sql), so whichever comes second sees what the first committed.

-- name: job_signal
-- Sends signal %(name)s with %(payload)s to job %(id)s through leaseq.signal (as the caller: a producer only to its own jobs): whether it was stored (the first under its name is kept) and whether the job was waiting for it (then claimable now).
SELECT s.stored, s.waiting FROM leaseq.signal(%(id)s, %(name)s, %(payload)s) s;

-- name: signal_read
-- The signal %(name)s of a job the caller holds (leaseq.lease_signal): found, its payload; no row when the lease is not held.
SELECT s.found, s.payload
  FROM leaseq.lease_signal(%(id)s, %(owner)s, %(token)s, %(secret)s, %(name)s,
                           %(now)s::timestamptz) s;

-- name: job_wait
-- A handler waiting for signal %(name)s (ctx.wait_for, leaseq.lease_wait): locks the held job's row, then hands it back without spending an attempt, claimable at %(until)s or at once if the signal is there; token bumped; the attempt recorded as released; no row when the lease is not held.
SELECT w.id, w.status, w.available_at, w.signalled, w.notified
  FROM leaseq.lease_wait(%(id)s, %(owner)s, %(token)s, %(secret)s, %(started_at)s::timestamptz,
                         %(name)s, %(until)s::timestamptz, %(now)s::timestamptz) w;

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
