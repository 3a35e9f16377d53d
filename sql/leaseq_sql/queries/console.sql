-- Named statements of the web console (leaseq.console). Every one is bounded by construction:
-- index probes, LIMITed scans and capped counts, never an exact count over leaseq.jobs or an
-- attempt table, never OFFSET. tests/console/test_console_plans.py EXPLAINs each against
-- 2,000,000 jobs. Each runs after console_bounds, in the same short transaction.

-- name: console_bounds
-- Bounds the console's transaction (milliseconds) and plans every statement for its actual parameters (a generic plan of an `x IS NULL OR col = x` filter could scan).
SELECT set_config('statement_timeout', %(ms)s::text, true),
       set_config('lock_timeout', %(ms)s::text, true),
       set_config('idle_in_transaction_session_timeout', %(ms)s::text, true),
       set_config('plan_cache_mode', 'force_custom_plan', true);

-- name: console_role
-- The console's database role, the admin actions it may take, and the planner's estimate of the hot table's rows.
SELECT session_user::text AS role,
       has_function_privilege('leaseq.console_retry_dead(bigint[], text, text, jsonb)', 'EXECUTE') AS can_retry,
       has_function_privilege('leaseq.console_cancel(bigint[], text, text, jsonb)', 'EXECUTE') AS can_cancel,
       has_function_privilege('leaseq.console_cancel_pipeline(bigint, text, text)', 'EXECUTE') AS can_cancel_pipeline,
       has_function_privilege('leaseq.console_resolve_step(bigint, text, jsonb, boolean, text, text)', 'EXECUTE') AS can_resolve_step,
       greatest((SELECT c.reltuples FROM pg_class c WHERE c.oid = 'leaseq.jobs'::regclass), 0)::bigint AS jobs_estimate;

-- name: console_privileges
-- Whether the console's role is a superuser, has BYPASSRLS or owns leaseq's tables (is a member of their owner): a role no policy or grant would hold. Catalog names, not 'leaseq.jobs'::regclass, which needs USAGE on the schema that a role granted nothing lacks.
SELECT current_user::text AS role, r.rolsuper AS superuser, r.rolbypassrls AS bypassrls,
       coalesce(pg_has_role(current_user, c.relowner, 'USAGE'), false) AS owns_tables
  FROM pg_roles r
  LEFT JOIN (pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'leaseq')
    ON c.relname = 'jobs'
 WHERE r.rolname = current_user;

-- name: console_queues
-- The most backed-up queues first: of the queues with pending, running, dead or waiting jobs, a worker or a schedule (at most %(scan)s found per source: a skip scan over the keyless and keyed claim indexes and the dead and waiting indexes, one probe per queue), ranked by their ready jobs among the first %(rank_cap)s of each claim index in claim order, then by the oldest ready one among those; the first %(limit)s, and how many were found (at least that many queues exist).
WITH RECURSIVE t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
pending AS (
    (SELECT j.queue FROM leaseq.jobs j
      WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
      ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM leaseq.jobs j
             WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
               AND j.queue > p.queue ORDER BY j.queue LIMIT 1)
      FROM pending p WHERE p.queue IS NOT NULL
),
-- Keyed jobs (flow control) are in their own claim index, jobs_key_claim_idx.
keyed AS (
    (SELECT j.queue FROM leaseq.jobs j
      WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
      ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM leaseq.jobs j
             WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
               AND j.queue > k.queue ORDER BY j.queue LIMIT 1)
      FROM keyed k WHERE k.queue IS NOT NULL
),
dead AS (
    (SELECT j.queue FROM leaseq.jobs j WHERE j.status = 'dead' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM leaseq.jobs j
             WHERE j.status = 'dead' AND j.queue > d.queue ORDER BY j.queue LIMIT 1)
      FROM dead d WHERE d.queue IS NOT NULL
),
-- Waiting jobs (unmet parents): the same skip scan over jobs_waiting_idx.
waiting AS (
    (SELECT j.queue FROM leaseq.jobs j
      WHERE j.deps_left > 0 AND j.finished_at IS NULL ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM leaseq.jobs j
             WHERE j.deps_left > 0 AND j.finished_at IS NULL AND j.queue > w.queue
             ORDER BY j.queue LIMIT 1)
      FROM waiting w WHERE w.queue IS NOT NULL
),
found AS (
    SELECT queue FROM (
        SELECT queue FROM (SELECT queue FROM pending LIMIT %(scan)s) p
        UNION SELECT queue FROM (SELECT queue FROM keyed LIMIT %(scan)s) k
        UNION SELECT queue FROM (SELECT queue FROM dead LIMIT %(scan)s) d
        UNION SELECT queue FROM (SELECT queue FROM waiting LIMIT %(scan)s) w
        -- Running jobs are at most the workers' total concurrency.
        UNION SELECT j.queue FROM leaseq.jobs j WHERE j.status = 'running'
        UNION SELECT unnest(w.queues) FROM leaseq.workers w
        UNION SELECT s.queue FROM leaseq.schedules s
    ) q
     WHERE queue IS NOT NULL
),
-- Per queue, a bounded look at each claim index: its first %(rank_cap)s rows in claim order.
ranked AS (
    SELECT f.queue, u.ready + k.ready AS ready, least(u.oldest, k.oldest) AS oldest
      FROM found f
      CROSS JOIN LATERAL (
          SELECT count(*) FILTER (WHERE x.available_at <= (SELECT now FROM t)) AS ready,
                 min(x.available_at) FILTER (WHERE x.available_at <= (SELECT now FROM t)) AS oldest
            FROM (SELECT j.available_at FROM leaseq.jobs j
                   WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
                     AND j.queue = f.queue
                   ORDER BY j.priority, j.available_at LIMIT %(rank_cap)s) x) u
      CROSS JOIN LATERAL (
          SELECT count(*) FILTER (WHERE x.available_at <= (SELECT now FROM t)) AS ready,
                 min(x.available_at) FILTER (WHERE x.available_at <= (SELECT now FROM t)) AS oldest
            FROM (SELECT j.available_at FROM leaseq.jobs j
                   WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                     AND j.queue = f.queue
                   LIMIT %(rank_cap)s) x) k
)
SELECT r.queue, count(*) OVER () AS found
  FROM ranked r
 ORDER BY least(r.ready, %(rank_cap)s) DESC, r.oldest NULLS LAST, r.queue
 LIMIT %(limit)s;

-- name: console_queue_panel
-- One queue's overview: ready, scheduled, dead and waiting jobs (waiting: a range of jobs_waiting_idx), each counted up to %(cap)s + 1 (more shows as "cap+"), ready and scheduled as ranges of the keyless claim index per priority plus a capped range of the keyed one (flow control; an aggregate's jobs behind its head are not ready); running jobs and the oldest heartbeat (bounded by the workers' concurrency); the oldest ready age (one probe per priority); live workers.
WITH RECURSIVE t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
priorities AS (
    (SELECT j.priority FROM leaseq.jobs j
      WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
        AND j.queue = %(queue)s ORDER BY j.priority LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority FROM leaseq.jobs j
             WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
               AND j.queue = %(queue)s AND j.priority > p.priority
             ORDER BY j.priority LIMIT 1)
      FROM priorities p WHERE p.priority IS NOT NULL
),
levels AS (SELECT p.priority FROM priorities p WHERE p.priority IS NOT NULL LIMIT 1000),
-- Per priority, ready jobs are one range of the claim index (available_at <= now) and
-- scheduled ones the next: each count stops after cap + 1 rows in all.
ready AS (
    SELECT count(*) AS ready FROM (
        SELECT 1 FROM levels p CROSS JOIN LATERAL (
            SELECT 1 FROM leaseq.jobs j
             WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
               AND j.queue = %(queue)s AND j.priority = p.priority
               AND j.available_at <= (SELECT now FROM t)
             LIMIT %(cap)s + 1) x
        LIMIT %(cap)s + 1) s
),
scheduled AS (
    SELECT count(*) AS scheduled FROM (
        SELECT 1 FROM levels p CROSS JOIN LATERAL (
            SELECT 1 FROM leaseq.jobs j
             WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
               AND j.queue = %(queue)s AND j.priority = p.priority
               AND j.available_at > (SELECT now FROM t)
             LIMIT %(cap)s + 1) x
        LIMIT %(cap)s + 1) s
),
oldest AS (
    SELECT min(f.available_at) AS available_at
      FROM levels p
      CROSS JOIN LATERAL (
          -- A job due at -infinity is ready but adds no age (no number of seconds): the
          -- probe starts after it.
          SELECT j.available_at FROM leaseq.jobs j
           WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
             AND j.queue = %(queue)s AND j.priority = p.priority
             AND j.available_at > '-infinity'::timestamptz
           ORDER BY j.available_at LIMIT 1) f
     WHERE f.available_at <= (SELECT now FROM t)
),
-- Keyed jobs: the first %(cap)s + 1 of the queue's range of jobs_key_claim_idx, in key order;
-- their oldest ready age is the oldest among those (exact below the cap).
keyed AS (
    SELECT count(*) FILTER (WHERE k.available_at <= (SELECT now FROM t)) AS ready,
           count(*) FILTER (WHERE k.available_at > (SELECT now FROM t)) AS scheduled,
           min(k.available_at) FILTER (WHERE k.available_at <= (SELECT now FROM t)
                                         AND isfinite(k.available_at)) AS oldest
      FROM (SELECT j.available_at FROM leaseq.jobs j
             WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
               AND j.queue = %(queue)s
             LIMIT %(cap)s + 1) k
),
running AS (
    SELECT count(*) AS running,
           min(j.heartbeat_at) FILTER (WHERE isfinite(j.heartbeat_at)) AS oldest_heartbeat
      FROM leaseq.jobs j
     WHERE j.status = 'running' AND j.queue = %(queue)s
),
dead AS (
    SELECT count(*) AS dead
      FROM (SELECT 1 FROM leaseq.jobs j
             WHERE j.status = 'dead' AND j.queue = %(queue)s
             ORDER BY j.finished_at, j.id LIMIT %(cap)s + 1) s
),
waiting AS (
    SELECT count(*) AS waiting
      FROM (SELECT 1 FROM leaseq.jobs j
             WHERE j.deps_left > 0 AND j.finished_at IS NULL AND j.queue = %(queue)s
             LIMIT %(cap)s + 1) s
),
live AS (
    SELECT count(*) AS workers, coalesce(sum(w.in_flight), 0)::bigint AS in_flight
      FROM leaseq.workers w
     WHERE %(queue)s = ANY(w.queues)
       -- Not silent by leaseq.core.models.is_silent: the rule leaseq status applies.
       AND w.heartbeat_at >= (SELECT now FROM t) - make_interval(secs => %(live_seconds)s)
)
SELECT %(queue)s::text AS queue, least(r.ready + k.ready, %(cap)s + 1) AS ready,
       least(s.scheduled + k.scheduled, %(cap)s + 1) AS scheduled, x.running, d.dead, w.waiting,
       extract(epoch FROM (SELECT now FROM t) - least(o.available_at, k.oldest))::float8
           AS oldest_ready_age,
       extract(epoch FROM (SELECT now FROM t) - x.oldest_heartbeat)::float8 AS oldest_heartbeat_age,
       l.workers, l.in_flight
  FROM ready r, scheduled s, oldest o, keyed k, running x, dead d, waiting w, live l;

-- name: console_id_bounds
-- The lowest and highest job id in the hot table (two index probes).
SELECT (SELECT min(j.id) FROM leaseq.jobs j) AS low, (SELECT max(j.id) FROM leaseq.jobs j) AS high;

-- name: console_id_below
-- The highest job id below a given one (one probe): where the next window of ids starts, skipping gaps.
SELECT max(j.id) AS id FROM leaseq.jobs j WHERE j.id < %(before)s;

-- name: console_jobs
-- Jobs in one window of ids (at most %(window)s ids below %(before)s, newest first) matching the filters, at most %(limit)s: a range of the primary key, so a rare filter costs one window, never the table.
SELECT j.id, j.queue, j.job_type, j.status::text AS status, j.priority, j.attempt_count,
       j.max_attempts, j.created_at, j.available_at, j.finished_at, j.lease_owner,
       j.last_error_code, left(j.last_error, 200) AS last_error, j.idempotency_key
  FROM leaseq.jobs j
 WHERE j.id < %(before)s AND j.id >= %(before)s - %(window)s
   AND (%(status)s::text IS NULL OR j.status = %(status)s::leaseq.job_status)
   AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
   AND (%(job_type)s::text IS NULL OR j.job_type = %(job_type)s)
   AND (%(error_code)s::text IS NULL OR j.last_error_code = %(error_code)s)
   AND (%(key)s::text IS NULL OR j.idempotency_key = %(key)s OR j.dedup_key = %(key)s)
   AND (%(created_from)s::timestamptz IS NULL OR j.created_at >= %(created_from)s)
   AND (%(created_to)s::timestamptz IS NULL OR j.created_at < %(created_to)s)
 ORDER BY j.id DESC
 LIMIT %(limit)s;

-- name: console_job
-- One job by id wherever it is (hot table, history, or only the ledger), with the effect its idempotency key wrote, if any; each of its documents (payload, progress, result, checkpoint) only when at most %(max_bytes)s bytes as JSON text, else NULL and flagged *_large.
-- The stored (compressed) size first: a document over the bound is never expanded to text,
-- let alone sent; one under it is measured as the text the page would load.
SELECT w.place, w.id, w.queue, w.job_type, w.status, w.priority, w.attempt_count,
       w.max_attempts, w.created_at, w.available_at, w.started_at, w.finished_at,
       w.lease_owner, w.lease_token, w.lease_expires_at, w.heartbeat_at,
       w.timeout_seconds, w.last_error, w.last_error_code, w.idempotency_key, w.dedup_key,
       CASE WHEN NOT s.payload_large THEN w.payload END AS payload, s.payload_large,
       CASE WHEN NOT s.progress_large THEN w.progress END AS progress, s.progress_large,
       CASE WHEN NOT s.result_large THEN w.result END AS result, s.result_large,
       CASE WHEN NOT s.checkpoint_large THEN w.checkpoint END AS checkpoint, s.checkpoint_large,
       (SELECT r.job_id FROM leaseq.job_results r
         WHERE r.queue = w.queue AND r.job_type = w.job_type AND r.idempotency_key = w.idempotency_key) AS effect_job_id
  FROM leaseq.job_whereabouts w
  CROSS JOIN LATERAL (
      SELECT coalesce(CASE WHEN pg_column_size(w.payload) > %(max_bytes)s THEN true
                           ELSE octet_length(w.payload::text) > %(max_bytes)s END, false) AS payload_large,
             coalesce(CASE WHEN pg_column_size(w.progress) > %(max_bytes)s THEN true
                           ELSE octet_length(w.progress::text) > %(max_bytes)s END, false) AS progress_large,
             coalesce(CASE WHEN pg_column_size(w.result) > %(max_bytes)s THEN true
                           ELSE octet_length(w.result::text) > %(max_bytes)s END, false) AS result_large,
             coalesce(CASE WHEN pg_column_size(w.checkpoint) > %(max_bytes)s THEN true
                           ELSE octet_length(w.checkpoint::text) > %(max_bytes)s END, false) AS checkpoint_large
  ) s
 WHERE w.id = %(id)s
 LIMIT 1;

-- name: console_job_attempts
-- A job's attempt timeline, in the hot table or in history, oldest first (at most %(limit)s).
SELECT a.attempt, a.lease_token, a.worker, a.started_at, a.ended_at, a.outcome::text AS outcome,
       a.error, a.traceback, 'hot'::text AS place
  FROM leaseq.job_attempts a
 WHERE a.job_id = %(id)s
UNION ALL
SELECT a.attempt, a.lease_token, a.worker, a.started_at, a.ended_at, a.outcome::text,
       a.error, a.traceback, 'history'
  FROM leaseq.job_ledger l
  -- LATERAL with OFFSET 0: the ledger's values prune the history to one partition.
  CROSS JOIN LATERAL (
      SELECT * FROM leaseq.job_attempt_history x
       WHERE x.job_id = l.id AND x.finished_at = l.finished_at AND x.keep_days = l.keep_days
      OFFSET 0
  ) a
 WHERE l.id = %(id)s
 ORDER BY lease_token
 LIMIT %(limit)s;

-- name: console_job_step_state
-- A job's status and its step %(name)s (no step columns when it has none; no row when there is no such job): why a resolve settled nothing.
SELECT j.status, s.name, s.attempt, s.lease_token, s.intended_at, s.finished_at, s.note,
       s.resolved_by, s.resolved_at, s.resolve_reason
  FROM leaseq.jobs j
  LEFT JOIN leaseq.job_steps s ON s.job_id = j.id AND s.name = %(name)s
 WHERE j.id = %(id)s;

-- name: console_job_steps
-- A keyset page of a job's durable steps (names after %(after)s, at most %(limit)s, in name order: a range of job_steps' primary key), each with its state (recorded; running: intended under the lease the job still holds; uncertain: an intent of an earlier attempt without an outcome; or not started), its result only when at most %(max_bytes)s bytes as JSON text (else NULL and result_large).
SELECT s.name, s.attempt, s.intended_at, s.finished_at, s.note,
       s.resolved_by, s.resolved_at, s.resolve_reason,
       CASE WHEN s.finished_at IS NOT NULL THEN 'recorded'
            WHEN s.lease_token IS NULL THEN 'not started'
            WHEN j.status = 'running' AND j.lease_token = s.lease_token THEN 'running'
            ELSE 'uncertain' END AS state,
       CASE WHEN NOT z.result_large THEN s.result END AS result, z.result_large
  FROM leaseq.job_steps s
  JOIN leaseq.jobs j ON j.id = s.job_id
  CROSS JOIN LATERAL (
      SELECT coalesce(CASE WHEN pg_column_size(s.result) > %(max_bytes)s THEN true
                           ELSE octet_length(s.result::text) > %(max_bytes)s END, false) AS result_large
  ) z
 WHERE s.job_id = %(id)s AND s.name > %(after)s
 ORDER BY s.name
 LIMIT %(limit)s;

-- name: console_job_step_facts
-- How many items a job's stream holds (counted up to %(cap)s; more shows as %(cap)s + 1) and the offset of its last one (NULL: none), from job_stream's primary key; the first of its steps, by name, that is uncertain (an intent without an outcome; NULL: none); and the signal it waits for, and since when (NULL: it waits for none).
-- The uncertain step is looked for within the job's range of job_steps' primary key (a job
-- stopped at one has only the steps it reached), under the console's statement timeout.
SELECT (SELECT count(*) FROM (SELECT 1 FROM leaseq.job_stream i WHERE i.job_id = %(id)s
                               LIMIT %(cap)s + 1) n) AS stream_items,
       (SELECT i.seq FROM leaseq.job_stream i WHERE i.job_id = %(id)s
         ORDER BY i.seq DESC LIMIT 1) AS stream_last,
       (SELECT s.name FROM leaseq.job_steps s
         WHERE s.job_id = %(id)s AND s.finished_at IS NULL AND s.lease_token IS NOT NULL
         ORDER BY s.name LIMIT 1) AS uncertain,
       w.waiting_for, w.waiting_since
  FROM (SELECT 1) one
  LEFT JOIN LATERAL (
      SELECT j.waiting_for, j.waiting_since FROM leaseq.jobs j
       WHERE j.id = %(id)s AND j.status = 'pending' AND j.waiting_for IS NOT NULL
  ) w ON true;

-- name: console_held
-- Jobs held at an uncertain step (waiting for a human's `leaseq steps resolve`), oldest first, at most %(limit)s, each with its first uncertain step by name (NULL: none found), read through jobs_held_idx.
SELECT j.id, j.queue, j.job_type, j.attempt_count, left(j.last_error, 200) AS last_error,
       (SELECT s.name FROM leaseq.job_steps s
         WHERE s.job_id = j.id AND s.finished_at IS NULL AND s.lease_token IS NOT NULL
         ORDER BY s.name LIMIT 1) AS step
  FROM leaseq.jobs j
 WHERE j.status = 'held' AND j.finished_at IS NULL
   AND j.status NOT IN ('waiting', 'pending', 'running')  -- jobs_held_idx's predicate
 ORDER BY j.id
 LIMIT %(limit)s;

-- name: console_dead
-- The newest dead jobs (at most %(scan)s looked at, newest first, in one queue or all) that match the type and error code filters, at most %(limit)s of them, with how many of those looked at matched and how many were looked at.
-- The scan reads only the dead indexes (they include type and error code); the shown rows are
-- fetched by id.
WITH recent AS (
    SELECT j.id, j.finished_at, j.job_type, j.last_error_code
      FROM leaseq.jobs j
     WHERE j.status = 'dead' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
     ORDER BY j.finished_at DESC, j.id DESC
     LIMIT %(scan)s
),
matching AS (
    SELECT r.id, r.finished_at FROM recent r
     WHERE (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s)
       AND (%(error_code)s::text IS NULL OR r.last_error_code = %(error_code)s)
),
shown AS (SELECT m.id FROM matching m ORDER BY m.finished_at DESC, m.id DESC LIMIT %(limit)s)
SELECT j.id, j.queue, j.job_type, j.attempt_count, j.finished_at, j.last_error_code,
       left(j.last_error, 200) AS last_error,
       (SELECT count(*) FROM matching) AS matched, (SELECT count(*) FROM recent) AS scanned
  FROM shown s JOIN leaseq.jobs j ON j.id = s.id
 ORDER BY j.finished_at DESC, j.id DESC;

-- name: console_dead_count
-- How many dead jobs match the filters among the newest %(scan)s dead jobs (of one queue or all), and how many were looked at.
WITH recent AS (
    SELECT j.job_type, j.last_error_code
      FROM leaseq.jobs j
     WHERE j.status = 'dead' AND (%(queue)s::text IS NULL OR j.queue = %(queue)s)
     ORDER BY j.finished_at DESC, j.id DESC
     LIMIT %(scan)s
)
SELECT count(*) FILTER (WHERE (%(job_type)s::text IS NULL OR r.job_type = %(job_type)s)
                          AND (%(error_code)s::text IS NULL OR r.last_error_code = %(error_code)s)) AS matched,
       count(*) AS scanned
  FROM recent r;

-- name: console_pending
-- Pending jobs of one queue (at most %(scan)s looked at: keyless ones in claim order, then keyed ones in key order) that match the type filter: at most %(limit)s ids, with how many matched and how many were looked at.
WITH recent AS (
    SELECT x.id, x.job_type FROM (
        (SELECT j.id, j.job_type
           FROM leaseq.jobs j
          WHERE j.status = 'pending' AND j.key IS NULL AND NOT j.ordering_waiting
            AND j.queue = %(queue)s
          ORDER BY j.priority, j.available_at, j.id
          LIMIT %(scan)s)
        UNION ALL
        (SELECT j.id, j.job_type
           FROM leaseq.jobs j
          WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
            AND j.queue = %(queue)s
          LIMIT %(scan)s)
    ) x
    LIMIT %(scan)s
),
matching AS (
    SELECT r.id FROM recent r WHERE %(job_type)s::text IS NULL OR r.job_type = %(job_type)s
)
SELECT coalesce((SELECT array_agg(x.id) FROM (SELECT id FROM matching ORDER BY id LIMIT %(limit)s) x), '{}') AS ids,
       (SELECT count(*) FROM matching) AS matched, (SELECT count(*) FROM recent) AS scanned;

-- name: console_retry_dead
-- Retries the given dead jobs and writes the audit row, in one transaction (leaseq.console_retry_dead); returns the ids retried.
SELECT id FROM leaseq.console_retry_dead(%(ids)s::bigint[], %(actor)s, %(reason)s, %(filter)s::jsonb);

-- name: console_cancel
-- Cancels the given pending or running jobs and writes the audit row, in one transaction (leaseq.console_cancel); returns the ids cancelled.
SELECT id FROM leaseq.console_cancel(%(ids)s::bigint[], %(actor)s, %(reason)s, %(filter)s::jsonb);

-- name: console_resolve_step
-- Settles an uncertain step of a dead job as `leaseq steps resolve` does and writes the audit row, in one transaction (leaseq.console_resolve_step); returns the job's id if it was settled.
SELECT id FROM leaseq.console_resolve_step(%(id)s, %(name)s, %(result)s::jsonb, %(retry)s, %(actor)s, %(reason)s);

-- name: console_workers
-- Registered workers (at most %(limit)s) with their heartbeat age and jobs in flight (running jobs they hold, from the running jobs: at most the workers' concurrency).
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
held AS (
    SELECT j.lease_owner, count(*) AS running,
           min(j.started_at) FILTER (WHERE isfinite(j.started_at)) AS oldest_started
      FROM leaseq.jobs j
     WHERE j.status = 'running'
     GROUP BY j.lease_owner
)
SELECT w.worker_id, w.pod, w.node, w.queues, w.concurrency, w.state, w.in_flight, w.job_types,
       -- As worker_list: an age from an infinite time is +-Infinity.
       CASE WHEN isfinite(w.heartbeat_at) THEN extract(epoch FROM (SELECT now FROM t) - w.heartbeat_at)::float8
            WHEN w.heartbeat_at < (SELECT now FROM t) THEN 'Infinity'::float8
            ELSE '-Infinity'::float8 END AS heartbeat_age,
       CASE WHEN isfinite(w.started_at) THEN extract(epoch FROM (SELECT now FROM t) - w.started_at)::float8
            WHEN w.started_at < (SELECT now FROM t) THEN 'Infinity'::float8
            ELSE '-Infinity'::float8 END AS age,
       coalesce(h.running, 0) AS running,
       extract(epoch FROM (SELECT now FROM t) - h.oldest_started)::float8 AS oldest_running_age
  FROM leaseq.workers w
  LEFT JOIN held h ON h.lease_owner = w.worker_id
 ORDER BY w.worker_id
 LIMIT %(limit)s;

-- name: console_schedules
-- Schedules (at most %(limit)s) with their next and last slots.
SELECT s.name, s.cron, s.timezone, s.queue, s.job_type, s.payload, s.paused, s.enabled,
       s.disabled_reason, s.overlap::text AS overlap, s.fire_after, s.last_slot, s.last_job_id,
       s.missed_slots, s.declared_by::text AS declared_by
  FROM leaseq.schedules s
 ORDER BY s.name
 LIMIT %(limit)s;

-- name: console_audit
-- The newest console audit rows (at most %(limit)s).
-- (At most the first 20 job ids of each row: a pipeline's cancel may name many.)
SELECT a.id, a.at, a.db_role, a.actor, a.action, a.job_ids[1:20] AS job_ids,
       cardinality(a.job_ids) AS n_jobs, a.asked, a.reason, a.filter
  FROM leaseq.console_audit a
 ORDER BY a.at DESC, a.id DESC
 LIMIT %(limit)s;

-- name: console_job_links
-- A job's pipeline, the job whose failure cancelled it (cancelled_by), its unmet parent count, and whether it has children; in the hot table or in history (by the ledger), one probe each.
SELECT j.pipeline_id, j.cancelled_by, j.deps_left, j.has_children, 'hot'::text AS place
  FROM leaseq.jobs j
 WHERE j.id = %(id)s
UNION ALL
SELECT h.pipeline_id, h.cancelled_by, h.deps_left, h.has_children, 'history'
  FROM leaseq.job_ledger l
  CROSS JOIN LATERAL (
      SELECT * FROM leaseq.job_history x
       WHERE x.id = l.id AND x.finished_at = l.finished_at AND x.keep_days = l.keep_days
      OFFSET 0
  ) h
 WHERE l.id = %(id)s
 LIMIT 1;

-- name: console_job_parents
-- A keyset page of a job's parents (ids above %(after)s, at most %(limit)s, in id order: a range of job_deps_child_idx) with their status (NULL: no longer in the hot table).
SELECT d.parent_id AS job_id, p.job_type, p.status::text AS status, d.after, d.counted
  FROM leaseq.job_deps d
  LEFT JOIN leaseq.jobs p ON p.id = d.parent_id
 WHERE d.child_id = %(id)s AND d.parent_id > %(after)s
 ORDER BY d.parent_id
 LIMIT %(limit)s;

-- name: console_job_children
-- A keyset page of a job's children (ids above %(after)s, at most %(limit)s, in id order: a range of job_deps' primary key) with their status (NULL: no longer in the hot table).
SELECT d.child_id AS job_id, c.job_type, c.status::text AS status, d.after, d.counted
  FROM leaseq.job_deps d
  LEFT JOIN leaseq.jobs c ON c.id = d.child_id
 WHERE d.parent_id = %(id)s AND d.child_id > %(after)s
 ORDER BY d.child_id
 LIMIT %(limit)s;

-- name: console_pipelines
-- A keyset page of pipelines, newest first, below id %(before)s (NULL: from the newest), at most %(limit)s, unfinished only when %(unfinished)s: a range of the primary key (or of pipelines_unfinished_idx).
SELECT p.id, p.name, p.created_at, p.total, p.succeeded, p.dead, p.cancelled, p.finished_at
  FROM leaseq.pipelines p
 WHERE (%(before)s::bigint IS NULL OR p.id < %(before)s::bigint)
   AND (NOT %(unfinished)s::boolean OR p.finished_at IS NULL)
 ORDER BY p.id DESC
 LIMIT %(limit)s;

-- name: console_pipeline
-- One pipeline and its counters (kept by the jobs' transitions: no count over jobs), by primary key.
SELECT p.id, p.name, p.created_at, p.total, p.succeeded, p.dead, p.cancelled, p.finished_at,
       p.total - p.succeeded - p.dead - p.cancelled AS unfinished
  FROM leaseq.pipelines p
 WHERE p.id = %(id)s;

-- name: console_pipeline_jobs
-- A keyset page of a pipeline's jobs, finished or not, in the hot table and in history (ids above %(after)s, in id order), of status %(status)s (all when NULL): the next %(window)s of its jobs (ranges of jobs_pipeline_idx and job_history_pipeline_idx; unfiltered, the next %(limit)s) looked at, at most %(limit)s matching shown, each with why it ended (last_error, at most 300 characters); one row even when none matches (id NULL), with the last id looked at and how many were looked at (the next page's cursor when the window filled).
WITH span AS (
    -- Unfiltered, the page is the window.
    SELECT CASE WHEN %(status)s::text IS NULL THEN least(%(limit)s, %(window)s) ELSE %(window)s END AS n
),
w AS (
    SELECT u.* FROM (
        (SELECT j.id, j.queue, j.job_type, j.status::text AS status, j.deps_left, j.attempt_count,
                j.lease_owner, j.created_at, j.finished_at, j.last_error_code,
                left(j.last_error, 300) AS last_error, 'hot'::text AS place
           FROM leaseq.jobs j
          WHERE j.pipeline_id = %(id)s AND j.id > %(after)s
          ORDER BY j.id
          LIMIT (SELECT n FROM span))
        UNION ALL
        -- A job is in one of the two (the mover deletes and inserts in one statement).
        (SELECT h.id, h.queue, h.job_type, h.status::text, h.deps_left, h.attempt_count,
                h.lease_owner, h.created_at, h.finished_at, h.last_error_code,
                left(h.last_error, 300), 'history'
           FROM leaseq.job_history h
          WHERE h.pipeline_id = %(id)s AND h.id > %(after)s
          ORDER BY h.id
          LIMIT (SELECT n FROM span))
    ) u
     ORDER BY u.id
     LIMIT (SELECT n FROM span)
),
m AS (
    SELECT w.* FROM w
     WHERE %(status)s::text IS NULL OR w.status = %(status)s::text
     ORDER BY w.id
     LIMIT %(limit)s
)
SELECT m.*, e.looked_to, e.looked
  FROM (SELECT max(w.id) AS looked_to, count(*) AS looked FROM w) e
  LEFT JOIN m ON true
 ORDER BY m.id;

-- name: console_cancel_pipeline
-- Cancels every unfinished job of a pipeline, as pipeline_cancel does, and writes the audit row, in one transaction (leaseq.console_cancel_pipeline); returns how many and how many were running.
SELECT cancelled, running FROM leaseq.console_cancel_pipeline(%(id)s, %(actor)s, %(reason)s);

-- name: registered_console_role
-- The console role leaseq.apply_console_grants registered last (no row: none, or it was dropped), and whether it is the role %(role)s names.
SELECT c.role_oid::regrole::text AS role, c.role_oid = to_regrole(%(role)s) AS same
  FROM leaseq.console_roles c
 WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid);

-- name: console_grants_apply
-- Grants the console's database role read access and, with admin, the console's three admin functions (revoking everything from the previous console roles first; NULL role: revoke only); returns every statement run.
SELECT statement FROM leaseq.apply_console_grants(%(role)s, %(admin)s) AS statement;

-- name: console_flow_limits
-- A keyset page of flow limits (key or pattern, max running, rate, burst, weight) in (queue, key_pattern) order after (%(after_queue)s, %(after_key)s), of queue %(queue)s (all when NULL), at most %(limit)s: a range of the primary key.
SELECT l.queue, l.key_pattern, l.max_running, l.per_second, l.burst, l.weight, l.updated_at
  FROM leaseq.flow_limits l
 WHERE (l.queue, l.key_pattern) > (%(after_queue)s::text, %(after_key)s::text)
   AND (%(queue)s::text IS NULL OR l.queue = %(queue)s::text)
 ORDER BY l.queue, l.key_pattern
 LIMIT %(limit)s;

-- name: console_flow_keys
-- A keyset page of keys with work in (queue, key) order after (%(after_queue)s, %(after_key)s), of queue %(queue)s (all when NULL), at most %(limit)s: units held (running) and free from the key's slot rows (at most its limit), running jobs of an unlimited key and ready jobs counted up to %(cap)s + 1 (capped, never exact over jobs), saturated when a limited key has no free unit.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT k.queue, k.key, k.max_running, k.weight, k.vtime, k.rated, k.paused_until,
       s.held, s.free,
       CASE WHEN k.max_running IS NULL
            -- jobs_key_held_idx's predicate, as in flow_status, read running jobs first (the
            -- status order is waiting, pending, running): a key's running jobs, counted
            -- exactly up to the cap, and then the jobs waiting their turn, not counted.
            THEN (SELECT count(*) FILTER (WHERE r.running) FROM (
                      SELECT j.status = 'running' AS running FROM leaseq.jobs j
                       WHERE j.queue = k.queue AND j.key = k.key AND j.key IS NOT NULL
                         AND (j.status = 'running' OR (j.status = 'pending' AND j.ordering_waiting))
                       ORDER BY j.status DESC
                       LIMIT %(cap)s + 1) r)
            ELSE s.held END AS running,
       (SELECT count(*) FROM (
            SELECT 1 FROM leaseq.jobs j
             WHERE j.queue = k.queue AND j.key = k.key AND j.key IS NOT NULL
               AND j.status = 'pending' AND NOT j.ordering_waiting AND j.available_at <= t.now
             LIMIT %(cap)s + 1) p) AS ready,
       (k.max_running IS NOT NULL AND s.free = 0) AS saturated
  FROM leaseq.flow_keys k
  CROSS JOIN t
  CROSS JOIN LATERAL (
      SELECT count(*) FILTER (WHERE x.job_id IS NOT NULL) AS held,
             count(*) FILTER (WHERE x.job_id IS NULL AND NOT x.retired) AS free
        FROM leaseq.flow_slots x
       WHERE x.queue = k.queue AND x.key = k.key
  ) s
 WHERE k.active
   AND (k.queue, k.key) > (%(after_queue)s::text, %(after_key)s::text)
   AND (%(queue)s::text IS NULL OR k.queue = %(queue)s::text)
 ORDER BY k.queue, k.key
 LIMIT %(limit)s;

-- name: console_flow_blocked
-- A keyset page of aggregates blocked by a dead head in (queue, ordering_key) order after (%(after_queue)s, %(after_key)s), of queue %(queue)s (all when NULL), at most %(limit)s (a range of flow_aggregates_blocked_key_idx): the head's id, type and status (NULL when pruned), since when, and the jobs waiting behind it counted up to %(cap)s + 1 through jobs_ordering_idx.
SELECT a.queue, a.ordering_key, a.blocked_by AS head, a.blocked_at,
       h.job_type AS head_type, h.status::text AS head_status,
       (SELECT count(*) FROM (
            SELECT 1 FROM leaseq.jobs j
             WHERE j.queue = a.queue AND j.ordering_key = a.ordering_key
               AND j.ordering_key IS NOT NULL AND j.status IN ('pending', 'running')
               AND j.ordering_waiting
             LIMIT %(cap)s + 1) w) AS waiting
  FROM leaseq.flow_aggregates a
  LEFT JOIN leaseq.jobs h ON h.id = a.blocked_by
 WHERE a.blocked_by IS NOT NULL
   AND (a.queue, a.ordering_key) > (%(after_queue)s::text, %(after_key)s::text)
   AND (%(queue)s::text IS NULL OR a.queue = %(queue)s::text)
 ORDER BY a.queue, a.ordering_key
 LIMIT %(limit)s;

-- name: console_flow_holders
-- Who holds the units of the given keys (parallel arrays %(queues)s and %(keys)s: one page of keys with work): per key, its held slot rows (at most its limit: a range of the primary key), each with the holding job (by id), its worker (lease_owner; the worker's row by primary key) and that worker's heartbeat age (Infinity when not registered), since when and when the lease expires; the first %(per_key)s per key, the longest silent first, with the key's counts of held units and of units whose worker has had no heartbeat for %(live_seconds)s seconds (the rule of leaseq.core.models.is_silent).
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT h.queue, h.key, h.slot, h.job_id, h.taken_at, h.lease_owner, h.lease_expires_at,
       h.heartbeat_age, h.held, h.held_silent
  FROM unnest(%(queues)s::text[], %(keys)s::text[]) AS s(queue, key)
  CROSS JOIN t
  CROSS JOIN LATERAL (
      SELECT x.queue, x.key, x.slot, x.job_id, x.taken_at, j.lease_owner, j.lease_expires_at,
             -- As console_workers: an age from an infinite time is +-Infinity.
             CASE WHEN w.heartbeat_at IS NULL THEN 'Infinity'::float8
                  WHEN isfinite(w.heartbeat_at) THEN extract(epoch FROM t.now - w.heartbeat_at)::float8
                  WHEN w.heartbeat_at < t.now THEN 'Infinity'::float8
                  ELSE '-Infinity'::float8 END AS heartbeat_age,
             count(*) OVER () AS held,
             count(*) FILTER (WHERE w.heartbeat_at IS NULL
                                 OR w.heartbeat_at < t.now - make_interval(secs => %(live_seconds)s))
                 OVER () AS held_silent,
             row_number() OVER (ORDER BY w.heartbeat_at NULLS FIRST, x.taken_at, x.slot) AS n
        FROM leaseq.flow_slots x
        LEFT JOIN leaseq.jobs j ON j.id = x.job_id
        LEFT JOIN leaseq.workers w ON w.worker_id = j.lease_owner
       WHERE x.queue = s.queue AND x.key = s.key AND x.job_id IS NOT NULL
       ORDER BY n
       LIMIT %(per_key)s
  ) h
 ORDER BY h.queue, h.key, h.n;
