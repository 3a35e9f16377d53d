-- Named statements on leaseq.workers: the registry the operator and dashboards read.

-- name: worker_upsert
-- Registers a worker process (with the job types it serves and when its process started by its host's clock) or refreshes its heartbeat, state, in-flight count and start-up time (NULL while loading).
INSERT INTO leaseq.workers AS w (worker_id, pod, node, queues, concurrency, state, in_flight, heartbeat_at,
                                 started_at, startup_seconds, job_types, boot_at)
VALUES (%(worker_id)s, %(pod)s, %(node)s, %(queues)s, %(concurrency)s, %(state)s, %(in_flight)s,
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()), %(startup_seconds)s,
        %(job_types)s, %(boot_at)s)
ON CONFLICT (worker_id) DO UPDATE
   SET state = EXCLUDED.state, in_flight = EXCLUDED.in_flight, heartbeat_at = EXCLUDED.heartbeat_at,
       startup_seconds = EXCLUDED.startup_seconds, job_types = EXCLUDED.job_types,
       boot_at = EXCLUDED.boot_at
RETURNING w.worker_id;

-- name: worker_delete
-- Removes a worker that exits cleanly.
DELETE FROM leaseq.workers WHERE worker_id = %(worker_id)s RETURNING worker_id;

-- name: worker_list
-- Workers with their running jobs counted from leaseq.jobs (in flight, age of the oldest one), their age, start-up time and job types.
-- An age from an infinite time is +-Infinity (a worker whose heartbeat is -infinity is silent);
-- the oldest running job's age counts only finite start times.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT w.worker_id, w.pod, w.node, w.queues, w.concurrency, w.state, w.started_at, w.heartbeat_at,
       CASE WHEN isfinite(w.heartbeat_at) THEN extract(epoch FROM t.now - w.heartbeat_at)::float8
            WHEN w.heartbeat_at < t.now THEN 'Infinity'::float8 ELSE '-Infinity'::float8 END AS heartbeat_age,
       count(j.id) AS running,
       extract(epoch FROM t.now - min(j.started_at) FILTER (WHERE isfinite(j.started_at)))::float8
           AS oldest_running_age,
       CASE WHEN isfinite(w.started_at) THEN extract(epoch FROM t.now - w.started_at)::float8
            WHEN w.started_at < t.now THEN 'Infinity'::float8 ELSE '-Infinity'::float8 END AS age,
       w.startup_seconds, w.job_types
  FROM t, leaseq.workers w
  LEFT JOIN leaseq.jobs j ON j.status = 'running' AND j.lease_owner = w.worker_id
 WHERE %(queues)s::text[] IS NULL OR w.queues && %(queues)s::text[]
 GROUP BY w.worker_id, t.now
 ORDER BY w.worker_id;

-- name: worker_prune_stale
-- Forgets workers whose registry heartbeat is older than the given age (their jobs are the reaper's).
DELETE FROM leaseq.workers
 WHERE heartbeat_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(older_than)s)
RETURNING worker_id;

-- name: worker_terminated
-- The workers registered from pod %(pod)s on node %(node)s whose process started (boot_at, by the node's clock) before %(finished_at)s, when the kubelet saw the pod's worker container terminate (by the same clock): none of them can still run. Only workers whose id is their process's own register boot_at, so no later process holds a lease under these ids.
SELECT w.worker_id
  FROM leaseq.workers w
 WHERE w.pod = %(pod)s AND w.node = %(node)s AND w.boot_at < %(finished_at)s::timestamptz
 ORDER BY w.worker_id;
