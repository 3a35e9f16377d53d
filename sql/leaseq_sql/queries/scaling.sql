-- Named statements the operator's scaling policy reads.

-- name: pool_work
-- Per job type in the given queues: claimable ready (keyless, and keyed within free units of their limits), due-soon and running jobs, and the mean run time of the newest attempts (at most max_samples) that ran to their end within the window.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
-- The newest attempts first, straight from the index (a scalar `now`, not a join with t, so
-- the scan stops after max_samples rows instead of sorting the whole window).
recent AS (
    SELECT a.job_id, a.ended_at - a.started_at AS took
      FROM leaseq.job_attempts a
     WHERE a.outcome IN ('succeeded', 'failed', 'timed_out')
       AND a.ended_at > (SELECT now FROM t) - make_interval(secs => %(window)s)
       AND a.ended_at <= (SELECT now FROM t)
       -- An attempt started at -infinity ran for no number of seconds: no sample.
       AND isfinite(a.started_at)
     ORDER BY a.ended_at DESC
     LIMIT %(max_samples)s
),
runs AS (
    SELECT j.job_type, avg(extract(epoch FROM r.took))::float8 AS mean_seconds, count(*) AS samples
      FROM recent r
      JOIN leaseq.jobs j ON j.id = r.job_id
     WHERE j.queue = ANY(%(queues)s::text[])
     GROUP BY j.job_type
),
-- Ready counts only what workers could claim now (flow control, migration 15): keyless
-- jobs, plus per key the smaller of its ready jobs and its free units of limit. Jobs waiting
-- for their aggregate's turn are neither ready nor soon.
by_key AS (
    SELECT j.queue, j.job_type, j.key,
           count(*) FILTER (WHERE j.available_at <= t.now) AS ready,
           count(*) FILTER (WHERE j.available_at > t.now
                              AND j.available_at <= t.now + make_interval(secs => %(horizon)s)) AS scheduled_soon
      FROM leaseq.jobs j, t
     WHERE j.status = 'pending' AND j.queue = ANY(%(queues)s::text[]) AND NOT j.ordering_waiting
       AND j.available_at <= t.now + make_interval(secs => %(horizon)s)
     GROUP BY j.queue, j.job_type, j.key
),
pending AS (
    SELECT b.job_type,
           sum(CASE WHEN b.key IS NULL OR f.max_running IS NULL THEN b.ready
                    ELSE least(b.ready, f.free) END)::bigint AS ready,
           sum(b.scheduled_soon)::bigint AS scheduled_soon
      FROM by_key b
      LEFT JOIN LATERAL (
          SELECT k.max_running,
                 (SELECT count(*) FROM leaseq.flow_slots s
                   WHERE s.queue = k.queue AND s.key = k.key AND s.job_id IS NULL
                     AND NOT s.retired) AS free
            FROM leaseq.flow_keys k
           WHERE b.key IS NOT NULL AND k.queue = b.queue AND k.key = b.key
      ) f ON true
     GROUP BY b.job_type
),
running AS (
    SELECT j.job_type, count(*) AS running
      FROM leaseq.jobs j
     WHERE j.status = 'running' AND j.queue = ANY(%(queues)s::text[])
     GROUP BY j.job_type
)
SELECT job_type,
       coalesce(p.ready, 0) AS ready, coalesce(p.scheduled_soon, 0) AS scheduled_soon,
       coalesce(r.running, 0) AS running, w.mean_seconds, coalesce(w.samples, 0) AS samples
  FROM pending p
  FULL JOIN running r USING (job_type)
  LEFT JOIN runs w USING (job_type)
 WHERE coalesce(p.ready, 0) + coalesce(p.scheduled_soon, 0) + coalesce(r.running, 0) > 0
 ORDER BY job_type;
