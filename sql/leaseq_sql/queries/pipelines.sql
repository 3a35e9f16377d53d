-- Named statements of pipelines (migration 0012): dependencies, graphs, fan-out, results by
-- reference, cascade cancel and progress. The unblocking, the cascade and its undo are
-- leaseq.pipeline_changed() (run by the trigger jobs_on_status, migration 26), in the
-- transaction of whichever statement finishes a parent (job_complete, job_fail, job_reap,
-- job_cancel, job_retry_dead...).

-- name: deps_lock_parents
-- Marks existing jobs as parents (has_children, as this login's policy lets it: a producer its own) and returns their current status, pipeline and queue; the row lock waits out a completion in flight, so the status read is the one the trigger will see.
UPDATE leaseq.jobs j SET has_children = true
 WHERE j.id = ANY(%(ids)s::bigint[])
RETURNING j.id, j.status::text AS status, j.pipeline_id, j.queue;

-- name: lease_spawn_lock
-- A fan-out's first half, in its spawner's completion transaction (leaseq.lease_spawn_lock): marks the held spawner and the existing jobs of its producer that its graph waits for as parents, row-locked, with their status, pipeline and queue; no row when the lease does not hold.
SELECT l.id, l.status, l.pipeline_id, l.queue
  FROM leaseq.lease_spawn_lock(%(id)s, %(owner)s, %(token)s, %(secret)s, %(parents)s::bigint[],
                               %(now)s::timestamptz) l;

-- name: lease_spawn
-- A fan-out's second half (leaseq.lease_spawn): the graph's jobs (fresh ids; in the edges -i names node i) and edges, in the held spawner's pipeline or a new one of its producer; the pipeline's id, no row when the lease does not hold.
SELECT s.pipeline_id
  FROM leaseq.lease_spawn(%(id)s, %(owner)s, %(token)s, %(secret)s, %(name)s, %(queues)s::text[],
                          %(job_types)s::text[], %(payloads)s::jsonb[], %(priorities)s::smallint[],
                          %(max_attempts)s::integer[], %(run_ats)s::timestamptz[],
                          %(delays)s::float8[], %(timeouts)s::float8[],
                          %(idempotency_keys)s::text[], %(deps_left)s::integer[],
                          %(has_children)s::boolean[], %(keys)s::text[], %(inherits)s::boolean[],
                          %(parents)s::bigint[], %(children)s::bigint[], %(afters)s::text[],
                          %(counted)s::boolean[], %(now)s::timestamptz) s;

-- name: job_ids_reserve
-- Reserves %(n)s job ids from the jobs' identity sequence, so a graph's edges can name its jobs before they are inserted.
SELECT nextval(pg_get_serial_sequence('leaseq.jobs', 'id')) AS id
  FROM generate_series(1, %(n)s);

-- name: pipeline_create
-- Creates a pipeline with %(total)s jobs to come, owned by this login; returns its id.
INSERT INTO leaseq.pipelines (name, total, created_at, created_by)
VALUES (%(name)s, %(total)s, coalesce(%(now)s::timestamptz, now()), current_user)
RETURNING id;

-- name: pipeline_grow
-- Adds %(n)s jobs to a pipeline's total (a fan-out from one of its jobs, or a job enqueued after one); an unfinished pipeline again.
UPDATE leaseq.pipelines SET total = total + %(n)s, finished_at = NULL
 WHERE id = %(id)s
RETURNING id;

-- name: graph_insert_jobs
-- Inserts a graph's jobs with their reserved ids, each waiting (deps_left > 0) or pending, in its pipeline, with its flow key, owned by this login (a handler's fan-out is leaseq.lease_spawn's).
INSERT INTO leaseq.jobs (id, queue, job_type, payload, priority, max_attempts, available_at,
                         timeout, idempotency_key, created_at, status, deps_left, has_children,
                         pipeline_id, key, enqueued_by, trace_context)
OVERRIDING SYSTEM VALUE
SELECT n.id, n.queue, n.job_type, n.payload, n.priority, n.max_attempts,
       coalesce(n.run_at, t.now + make_interval(secs => n.delay)),
       make_interval(secs => n.timeout), n.idempotency_key, t.now,
       CASE WHEN n.deps_left > 0 THEN 'waiting' ELSE 'pending' END::leaseq.job_status,
       n.deps_left, n.has_children, %(pipeline_id)s, n.key, current_user, %(trace_context)s::jsonb
  FROM unnest(%(ids)s::bigint[], %(queues)s::text[], %(job_types)s::text[], %(payloads)s::jsonb[],
              %(priorities)s::smallint[], %(max_attempts)s::integer[], %(run_ats)s::timestamptz[],
              %(delays)s::float8[], %(timeouts)s::float8[], %(idempotency_keys)s::text[],
              %(deps_left)s::integer[], %(has_children)s::boolean[], %(keys)s::text[])
       AS n(id, queue, job_type, payload, priority, max_attempts, run_at, delay, timeout,
            idempotency_key, deps_left, has_children, key),
       (SELECT coalesce(%(now)s::timestamptz, now()) AS now) t;

-- name: graph_insert_deps
-- Inserts a graph's edges (counted: already met when written, a parent that had finished).
INSERT INTO leaseq.job_deps (parent_id, child_id, after, counted)
SELECT * FROM unnest(%(parents)s::bigint[], %(children)s::bigint[], %(afters)s::text[],
                     %(counted)s::boolean[]);

-- name: queues_wake
-- Wakes the workers of the given queues on commit (jobs that became claimable).
SELECT count(pg_notify('leaseq_jobs', q)) AS notified FROM unnest(%(queues)s::text[]) AS q;

-- name: parent_results
-- One keyset page of a job's parents with their status and result, in id order after %(after_id)s: an index range of job_deps, however wide the fan-in.
SELECT d.parent_id AS job_id, p.job_type, p.status::text AS status, p.result, d.after
  FROM leaseq.job_deps d
  JOIN leaseq.jobs p ON p.id = d.parent_id
 WHERE d.child_id = %(id)s AND d.parent_id > %(after_id)s
 ORDER BY d.parent_id
 LIMIT %(limit)s;

-- name: job_parents
-- Up to %(limit)s parents of a job, with their status and the edge's condition.
SELECT d.parent_id AS job_id, p.job_type, p.status::text AS status, d.after
  FROM leaseq.job_deps d
  JOIN leaseq.jobs p ON p.id = d.parent_id
 WHERE d.child_id = %(id)s
 ORDER BY d.parent_id
 LIMIT %(limit)s;

-- name: job_children
-- Up to %(limit)s children of a job, with their status and the edge's condition.
SELECT d.child_id AS job_id, c.job_type, c.status::text AS status, d.after
  FROM leaseq.job_deps d
  JOIN leaseq.jobs c ON c.id = d.child_id
 WHERE d.parent_id = %(id)s
 ORDER BY d.child_id
 LIMIT %(limit)s;

-- name: job_pipeline_state
-- A job's pipeline, unmet parent count and the job whose failure cancelled it, if any.
SELECT j.id, j.pipeline_id, j.deps_left, j.cancelled_by FROM leaseq.jobs j WHERE j.id = %(id)s;

-- name: pipeline_cancel
-- Cancels every unfinished job of a pipeline (waiting, pending, running: a running holder is fenced from then on, its attempt recorded as cancelled) as the caller's role may (leaseq.cancel_as_caller: a producer only its own); returns how many and how many were running.
SELECT count(*) AS cancelled, count(*) FILTER (WHERE c.previous_status = 'running') AS running
  FROM leaseq.cancel_as_caller(NULL, %(id)s::bigint, %(reason)s, coalesce(%(now)s::timestamptz, now())) c;

-- name: pipeline_get
-- One pipeline's progress: a primary-key lookup.
SELECT p.id, p.name, p.created_at, p.total, p.succeeded, p.dead, p.cancelled, p.finished_at
  FROM leaseq.pipelines p WHERE p.id = %(id)s;

-- name: pipeline_sinks
-- Up to %(limit)s of a pipeline's sinks (its jobs no other job waits for: a fan-out's merge) with their outcome, newest first: jobs_pipeline_idx read from the pipeline's end, where a fan-out writes its merge.
SELECT j.id, j.status::text AS status, j.result, j.last_error, j.last_error_code, j.attempt_count
  FROM leaseq.jobs j
 WHERE j.pipeline_id = %(id)s AND NOT j.has_children
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: job_pipeline_of
-- A job's pipeline, else the one its fan-out started (the pipeline of its first child that has one: a job without a pipeline that spawns is the met parent of its fan-out, not one of its jobs); no row when the job does not exist.
SELECT j.id,
       coalesce(j.pipeline_id,
                (SELECT c.pipeline_id FROM leaseq.job_deps d JOIN leaseq.jobs c ON c.id = d.child_id
                  WHERE d.parent_id = j.id AND c.pipeline_id IS NOT NULL
                  ORDER BY d.child_id LIMIT 1)) AS pipeline_id
  FROM leaseq.jobs j
 WHERE j.id = %(id)s;

-- name: pipeline_list
-- A keyset page of pipelines, newest first, below id %(before)s (NULL: from the newest); unfinished only when %(unfinished)s.
SELECT p.id, p.name, p.created_at, p.total, p.succeeded, p.dead, p.cancelled, p.finished_at
  FROM leaseq.pipelines p
 WHERE (%(before)s::bigint IS NULL OR p.id < %(before)s::bigint)
   AND (NOT %(unfinished)s OR p.finished_at IS NULL)
 ORDER BY p.id DESC
 LIMIT %(limit)s;

-- name: pipeline_jobs
-- A keyset page of a pipeline's jobs in id order after %(after_id)s.
SELECT j.id AS job_id, j.job_type, j.status::text AS status, j.deps_left, j.cancelled_by
  FROM leaseq.jobs j
 WHERE j.pipeline_id = %(id)s AND j.id > %(after_id)s
 ORDER BY j.id
 LIMIT %(limit)s;

-- name: queue_waiting
-- Waiting jobs per queue (their parents unmet): a scan of the small jobs_waiting_idx only.
SELECT j.queue, count(*) AS waiting
  FROM leaseq.jobs j
 WHERE j.deps_left > 0 AND j.finished_at IS NULL
   AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
 GROUP BY j.queue
 ORDER BY j.queue;
