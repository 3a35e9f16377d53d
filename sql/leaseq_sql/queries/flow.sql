-- Named statements of flow control (migrations 15 and 18): the keyed claims (the worker's
-- door to a lease, definitions/claims.sql), limits, repairs, status.

-- name: job_claim_keyed
-- Leases up to %(limit)s ready keyed jobs, walking the active keys of the given queues by fair turn (vtime); a limited key's jobs are taken only with free slots of its limit (never more jobs than slots), locked and written in the same statement (leaseq.lease_claim_keyed, definitions/claims.sql); bumps attempt and token.
SELECT c.*
  FROM leaseq.lease_claim_keyed(%(queues)s::text[], %(job_types)s::text[], %(owner)s, %(limit)s,
                               %(lease_seconds)s, %(claim_id)s, %(claim_secret)s, %(now)s::timestamptz) c;

-- name: job_claim_keyed_slots
-- Leases up to %(limit)s ready keyed jobs as job_claim_keyed does, from queues that have no rate set (no row of flow_limits with per_second): the same walk of their active keys by fair turn, a limited key's jobs taken only with free slots of its limit (never more jobs than slots), without the buckets that a rated key's claim locks and writes. Where one of the queues has a rate it claims nothing; every row says so in "rated", and a claim that took no job returns one row whose job fields are NULL. (leaseq.lease_claim_keyed_slots, definitions/claims.sql)
SELECT c.*
  FROM leaseq.lease_claim_keyed_slots(%(queues)s::text[], %(job_types)s::text[], %(owner)s, %(limit)s,
                                     %(lease_seconds)s, %(claim_id)s, %(claim_secret)s, %(now)s::timestamptz) c;

-- name: job_claim_keyed_open
-- Leases up to %(limit)s ready keyed jobs as job_claim_keyed does, from queues that have no limit or rate set (no such row in flow_limits): the same walk of their active keys by fair turn, without the slots and buckets that a limited key's claim locks and writes. Where one of the queues has one it claims nothing; every row says so in "limited" (and in "rated" whether a rate is among them), and a claim that took no job returns one row whose job fields are NULL. (leaseq.lease_claim_keyed_open, definitions/claims.sql)
SELECT c.*
  FROM leaseq.lease_claim_keyed_open(%(queues)s::text[], %(job_types)s::text[], %(owner)s, %(limit)s,
                                    %(lease_seconds)s, %(claim_id)s, %(claim_secret)s, %(now)s::timestamptz) c;

-- name: flow_limit_set
-- Sets a queue's limit for a key or key pattern (max running jobs, NULL for none; fair-share weight; starts per second with a burst, NULL for none) and applies it to every key it governs at once; returns how many keys it updated.
SELECT leaseq.flow_limit_set(%(queue)s, %(pattern)s, %(max_running)s, %(weight)s, %(per_second)s,
                             %(burst)s, false) AS keys;

-- name: flow_limit_remove
-- Removes a queue's limit for a key or key pattern; the keys it governed fall back to the next matching limit (or none); returns how many keys it updated.
SELECT leaseq.flow_limit_set(%(queue)s, %(pattern)s, NULL, NULL, NULL, NULL, true) AS keys,
       EXISTS (SELECT 1 FROM leaseq.flow_limits l
                WHERE l.queue = %(queue)s AND l.key_pattern = %(pattern)s) AS still_there;

-- name: flow_limit_list
-- The limits set, per queue (all when %(queue)s is NULL) and key pattern.
SELECT l.queue, l.key_pattern, l.max_running, l.weight, l.per_second, l.burst, l.updated_at
  FROM leaseq.flow_limits l
 WHERE %(queue)s::text IS NULL OR l.queue = %(queue)s::text
 ORDER BY l.queue, l.key_pattern;

-- name: flow_repair
-- The reaper's check: frees up to %(batch)s slots whose holder is not a running attempt with the same token (each re-checked under its lock); returns the slots freed per queue.
SELECT r.queue, r.repaired FROM leaseq.flow_repair(%(batch)s) r ORDER BY r.queue;

-- name: flow_settle
-- The reaper's sweep: wakes the sleeping keys whose next job is due within %(ahead)s seconds; of each queue's first %(batch)s keys in turn, deactivates the idle ones (no pending job, none running) and puts to sleep those with none running and no job due within twice that (each re-checked under its lock); returns per queue the keys deactivated, put to sleep and woken.
SELECT s.queue, s.settled, s.slept, s.woken FROM leaseq.flow_settle(%(batch)s, %(ahead)s) s ORDER BY s.queue;

-- name: flow_repairs_total
-- Slots the reaper's check has freed so far, per queue (expected 0).
SELECT f.queue, f.repaired FROM leaseq.flow_repairs f ORDER BY f.queue;

-- name: flow_unblock
-- Skips the dead head of a blocked aggregate: its next job becomes claimable; returns that job's id (NULL if none is left).
SELECT leaseq.flow_unblock(%(queue)s, %(ordering_key)s) AS head;

-- name: flow_status
-- Per queue and key with unfinished jobs: the limit, running and ready jobs, whether it is saturated (no free slot), the units held by workers silent for %(live_seconds)s seconds or not registered (the rule of leaseq.core.models.is_silent), its weight and virtual time, the pause in force; at most %(limit)s keys, saturated first.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
SELECT k.queue, k.key, k.max_running, k.weight, k.vtime,
       CASE WHEN k.paused_until > t.now THEN k.paused_until END AS paused_until,
       r.running, p.ready,
       (k.max_running IS NOT NULL AND f.free = 0) AS saturated,
       CASE WHEN k.max_running IS NULL THEN p.ready ELSE least(p.ready, f.free) END AS claimable,
       h.held_silent
  FROM leaseq.flow_keys k
  CROSS JOIN t
  CROSS JOIN LATERAL (
      SELECT count(*) AS free FROM leaseq.flow_slots s
       WHERE s.queue = k.queue AND s.key = k.key AND s.job_id IS NULL AND NOT s.retired
  ) f
  CROSS JOIN LATERAL (
      -- A held unit's job and worker by primary key; at most the key's limit of them.
      SELECT count(*) AS held_silent FROM leaseq.flow_slots s
        LEFT JOIN leaseq.jobs j ON j.id = s.job_id
        LEFT JOIN leaseq.workers w ON w.worker_id = j.lease_owner
       WHERE s.queue = k.queue AND s.key = k.key AND s.job_id IS NOT NULL
         AND (w.heartbeat_at IS NULL
              OR w.heartbeat_at < t.now - make_interval(secs => %(live_seconds)s))
  ) h
  CROSS JOIN LATERAL (
      -- The predicate of jobs_key_held_idx, not status = 'running' alone: that would also
      -- fit jobs_running_idx, which statistics taken before jobs ran show empty, and a plan
      -- on it reads every running job of the queue for each key.
      SELECT count(*) FILTER (WHERE j.status = 'running') AS running FROM leaseq.jobs j
       WHERE (j.status = 'running' OR (j.status = 'pending' AND j.ordering_waiting))
         AND j.key IS NOT NULL AND j.queue = k.queue AND j.key = k.key
  ) r
  CROSS JOIN LATERAL (
      SELECT count(*) AS ready FROM leaseq.jobs j
       WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
         AND j.queue = k.queue AND j.key = k.key AND j.available_at <= t.now
  ) p
 WHERE k.active AND (%(queues)s::text[] IS NULL OR k.queue = ANY(%(queues)s::text[]))
 ORDER BY saturated DESC, k.queue, k.key
 LIMIT %(limit)s;

-- name: flow_blocked
-- Aggregates blocked by a dead head, per queue (all when %(queues)s is NULL): the head's id, since when, and how many jobs wait behind it; at most %(limit)s.
SELECT a.queue, a.ordering_key, a.blocked_by AS head, a.blocked_at,
       (SELECT count(*) FROM leaseq.jobs j
         WHERE j.queue = a.queue AND j.ordering_key = a.ordering_key
           AND j.status = 'pending' AND j.ordering_waiting) AS waiting
  FROM leaseq.flow_aggregates a
 WHERE a.blocked_by IS NOT NULL AND (%(queues)s::text[] IS NULL OR a.queue = ANY(%(queues)s::text[]))
 ORDER BY a.queue, a.blocked_at
 LIMIT %(limit)s;

-- name: flow_active
-- Whether any of the given queues has a key with unfinished jobs (the keyed claim has something to look at).
SELECT EXISTS (SELECT 1 FROM leaseq.flow_keys k
                WHERE k.queue = ANY(%(queues)s::text[]) AND k.active) AS active;

-- name: flow_queue_summary
-- Per queue (all when %(queues)s is NULL): jobs workers could claim now (keyless ready, plus per key the smaller of its ready jobs and free units), keys with ready work but no free unit, and aggregates blocked by a dead head.
WITH t AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now),
ready AS (
    SELECT j.queue, j.key, count(*) AS ready
      FROM leaseq.jobs j, t
     WHERE j.status = 'pending' AND NOT j.ordering_waiting AND j.available_at <= t.now
       AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
     GROUP BY j.queue, j.key
),
per_key AS (
    SELECT r.queue, r.key, r.ready,
           CASE WHEN r.key IS NULL OR f.max_running IS NULL THEN r.ready
                ELSE least(r.ready, f.free) END AS claimable,
           (r.key IS NOT NULL AND f.max_running IS NOT NULL AND f.free = 0) AS saturated
      FROM ready r
      LEFT JOIN LATERAL (
          SELECT k.max_running,
                 (SELECT count(*) FROM leaseq.flow_slots s
                   WHERE s.queue = k.queue AND s.key = k.key AND s.job_id IS NULL
                     AND NOT s.retired) AS free
            FROM leaseq.flow_keys k
           WHERE r.key IS NOT NULL AND k.queue = r.queue AND k.key = r.key
      ) f ON true
),
blocked AS (
    SELECT a.queue, count(*) AS blocked FROM leaseq.flow_aggregates a
     WHERE a.blocked_by IS NOT NULL
       AND (%(queues)s::text[] IS NULL OR a.queue = ANY(%(queues)s::text[]))
     GROUP BY a.queue
),
per_queue AS (
    SELECT p.queue, sum(p.claimable)::bigint AS claimable,
           count(*) FILTER (WHERE p.saturated) AS saturated_keys
      FROM per_key p GROUP BY p.queue
)
SELECT queue, coalesce(q.claimable, 0) AS claimable, coalesce(q.saturated_keys, 0) AS saturated_keys,
       coalesce(b.blocked, 0) AS blocked_aggregates
  FROM per_queue q FULL JOIN blocked b USING (queue)
 ORDER BY queue;

-- name: flow_pause
-- Pauses a key until %(until)s (a handler told to back off): none of its jobs is claimed before then; returns the pause in force (NULL: the key has no unfinished job).
SELECT leaseq.flow_pause(%(queue)s, %(key)s, %(until)s) AS paused_until;

-- name: flow_resume
-- Ends a key's pause now (`leaseq limits resume`); whether it had one.
SELECT leaseq.flow_resume(%(queue)s, %(key)s) AS resumed;

-- name: job_back_off
-- A handler told to back off (HTTP 429, Retry-After): hands a held job back without spending an attempt, not before %(seconds)s from now, and pauses its key (if any) until then, in one statement (leaseq.lease_back_off); token bumped; the attempt is recorded as released.
SELECT b.id, b.status, b.available_at, b.paused_until
  FROM leaseq.lease_back_off(%(id)s, %(owner)s, %(token)s, %(secret)s, %(started_at)s::timestamptz,
                             %(seconds)s, %(reason)s, %(now)s::timestamptz) b;
