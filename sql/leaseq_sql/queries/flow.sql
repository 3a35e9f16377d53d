-- Named statements of flow control (migrations 15 and 18): the keyed claims, limits, repairs, status.
--
-- The three keyed claims (job_claim_keyed, job_claim_keyed_slots, job_claim_keyed_open) are
-- each written whole, so that each reads in one place. The pieces they have in common are
-- copies, each between the lines "-- shared: NAME" and "-- end shared: NAME";
-- tests/unit/test_statements.py checks that every copy of a NAME is the same SQL (comments
-- and indentation aside), so a change to one fails until it is made to all. Why a piece is
-- as it is is said once, in job_claim_keyed's copy.

-- name: job_claim_keyed
-- Leases up to %(limit)s ready keyed jobs, walking the active keys of the given queues by fair turn (vtime); a limited key's jobs are taken only with free slots of its limit (never more jobs than slots), locked and written in the same statement; bumps attempt and token.
-- Now is coalesce(%(now)s, now()) wherever it is needed, not a CTE joined into every part:
-- the generic plan has fewer nodes to set up at every claim (57 before, 44 now).
WITH candidate AS (
    SELECT c.id, c.queue, c.key, c.slot, c.bucket, c.lease_token, c.rated
      FROM unnest(%(queues)s::text[]) AS q(queue)
      CROSS JOIN LATERAL (
          SELECT k.queue, k.key, s.slots[j.n] AS slot, r.bucket, j.id, j.lease_token, k.rated
            FROM leaseq.flow_keys k
            -- shared: keyed_slots
            -- A limited key's free slots (their ids), locked, at most %(limit)s (NULL for an
            -- unlimited key). The slots first: a saturated key's pending rows are never read.
            CROSS JOIN LATERAL (
                SELECT array_agg(x.id) AS slots FROM (
                    SELECT x.id FROM leaseq.flow_slots x
                     WHERE k.max_running IS NOT NULL
                       AND x.queue = k.queue AND x.key = k.key AND x.job_id IS NULL AND NOT x.retired
                     LIMIT %(limit)s
                       FOR UPDATE SKIP LOCKED
                ) x
            ) s
            -- end shared: keyed_slots
            -- A rate-limited key's bucket, locked: its id and the starts it allows now (a
            -- bucket last filled at -infinity is full, one at infinity gains nothing).
            LEFT JOIN LATERAL (
                SELECT b.id AS bucket, floor(least(b.burst, b.tokens + b.per_second
                                   * greatest(CASE WHEN isfinite(b.tokens_at) THEN extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - b.tokens_at)
                                                 WHEN b.tokens_at < 'epoch' THEN 'Infinity' END, 0)))::int AS allows
                  FROM leaseq.flow_buckets b
                 WHERE k.rated AND b.queue = k.queue AND b.key = k.key
                   FOR UPDATE SKIP LOCKED
            ) r ON true
            -- shared: keyed_ready
            -- Key k's ready jobs in order, numbered; how many (the LIMIT below) differs.
            CROSS JOIN LATERAL (
                SELECT r.id, r.lease_token, row_number() OVER () AS n FROM (
                    SELECT j.id, j.lease_token
                      FROM leaseq.jobs j
                     WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                       AND j.queue = k.queue AND j.key = k.key AND j.available_at <= coalesce(%(now)s::timestamptz, now())
                       AND (%(job_types)s::text[] IS NULL OR j.job_type = ANY(%(job_types)s::text[]))
                     ORDER BY j.priority, j.available_at, j.id
            -- end shared: keyed_ready
                     LIMIT least(CASE WHEN k.max_running IS NULL THEN %(limit)s
                                      ELSE coalesce(cardinality(s.slots), 0) END,
                                 CASE WHEN k.rated THEN r.allows ELSE %(limit)s END)
                       FOR UPDATE SKIP LOCKED
                ) r
            ) j
           WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
             AND (k.paused_until IS NULL OR k.paused_until <= coalesce(%(now)s::timestamptz, now()))
             AND (k.max_running IS NULL OR s.slots IS NOT NULL)
             AND (NOT k.rated OR r.allows >= 1)
           ORDER BY k.vtime, k.key
           LIMIT %(limit)s
      ) c
     LIMIT %(limit)s
),
spent AS (
    UPDATE leaseq.flow_buckets b
       SET tokens = least(b.burst, b.tokens + b.per_second
                                   * greatest(CASE WHEN isfinite(b.tokens_at) THEN extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - b.tokens_at)
                                                 WHEN b.tokens_at < 'epoch' THEN 'Infinity' END, 0)) - c.n,
           tokens_at = greatest(b.tokens_at, coalesce(%(now)s::timestamptz, now()))
      FROM (SELECT x.bucket, count(*) AS n FROM candidate x WHERE x.rated GROUP BY x.bucket) c
     -- An array, not only a join: the generic plan cannot see how few candidates there are
     -- and would hash-join a sequential scan of the table; this is an index scan either way.
     -- One array of ids (migration 47), not two of queue and key, which PostgreSQL 15
     -- costed as a descent per pair and scanned the whole table instead.
     WHERE b.id = ANY (ARRAY(SELECT x.bucket FROM candidate x WHERE x.rated))
       AND b.id = c.bucket
    RETURNING b.key
),
-- shared: keyed_taken
-- The slots given to their candidates, each by its id (migration 47) with the job's new token.
-- By id, not by the row's address (ctid) the claim locked: a free slot updated and committed
-- after the statement's snapshot is locked in its new version, which the snapshot cannot see
-- at the old address, and a limit of 2 then ran 3 jobs at once.
taken AS (
    UPDATE leaseq.flow_slots s
       SET job_id = c.id, lease_token = leaseq.lease_token_next(c.lease_token, (SELECT leaseq.lease_epoch())), taken_at = coalesce(%(now)s::timestamptz, now())
      FROM candidate c
     -- An array, not only a join: an index scan whatever the plan. One array of ids, not
     -- three of queue, key and number: PostgreSQL 15's generic plan costed those as a
     -- descent per combination of their elements and scanned the whole table instead.
     WHERE s.id = ANY (ARRAY(SELECT x.slot FROM candidate x WHERE x.slot IS NOT NULL))
       AND s.id = c.slot
    RETURNING s.job_id
),
-- end shared: keyed_taken
-- shared: keyed_claimed
-- The last step: the candidates leased, each the moment its claim holds its unit.
claimed AS (
    UPDATE leaseq.jobs j
       SET status = 'running',
           -- Whatever it waited for (ctx.wait_for) is over: it runs.
           waiting_for = NULL, waiting_since = NULL,
           attempt_count = j.attempt_count + 1,
           lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
           lease_owner = %(owner)s,
           claim_id = %(claim_id)s,
           -- Only the digest of the lease's secret, sha256(claim secret || id) (leaseq.core.capability).
           lease_digest = sha256(sha256(%(claim_secret)s::bytea || int8send(j.id))),
           -- The moment the claim holds its unit (its locks are taken before any row is
           -- updated), not the transaction's start: the attempts of one key never overlap
           -- beyond its limit, even for a claim that started before the unit was given back.
           started_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
           heartbeat_at = coalesce(%(now)s::timestamptz, now()),
           lease_expires_at = coalesce(%(now)s::timestamptz, now())
                              + least(make_interval(secs => %(lease_seconds)s),
                                      coalesce(j.timeout, make_interval(secs => %(lease_seconds)s)))
     WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
    RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
              j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
              extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
              j.idempotency_key, j.checkpoint
)
-- end shared: keyed_claimed
SELECT claimed.* FROM claimed ORDER BY priority, available_at, id;

-- name: job_claim_keyed_slots
-- Leases up to %(limit)s ready keyed jobs as job_claim_keyed does, from queues that have no rate set (no row of flow_limits with per_second): the same walk of their active keys by fair turn, a limited key's jobs taken only with free slots of its limit (never more jobs than slots), without the buckets that a rated key's claim locks and writes. Where one of the queues has a rate it claims nothing; every row says so in "rated", and a claim that took no job returns one row whose job fields are NULL.
-- Why a second statement: job_claim_keyed's buckets and their UPDATE are set up at every
-- call of its generic plan. A claim and completion of one job of a key with a limit of 4
-- cost 2,036,000 server instructions by job_claim_keyed, 1,942,000 by this one (PostgreSQL
-- 18.6, one job at a time, counted with an instruction-counting profiler; a keyless job
-- 1,199,000).
WITH rated AS (
    SELECT
    -- shared: queues_rated
    -- Whether one of the queues has a rate set: one probe of flow_limits_rated_idx
    -- (migration 27).
    EXISTS (SELECT 1 FROM leaseq.flow_limits r
             WHERE r.queue = ANY (%(queues)s::text[]) AND r.per_second IS NOT NULL)
    -- end shared: queues_rated
    AS yes
),
candidate AS (
    SELECT c.id, c.queue, c.key, c.slot, c.lease_token
      FROM unnest(%(queues)s::text[]) AS q(queue)
      CROSS JOIN LATERAL (
          SELECT k.queue, k.key, z.id, s.slots[z.n] AS slot, z.lease_token
            FROM leaseq.flow_keys k
            -- shared: keyed_slots
            CROSS JOIN LATERAL (
                SELECT array_agg(x.id) AS slots FROM (
                    SELECT x.id FROM leaseq.flow_slots x
                     WHERE k.max_running IS NOT NULL
                       AND x.queue = k.queue AND x.key = k.key AND x.job_id IS NULL AND NOT x.retired
                     LIMIT %(limit)s
                       FOR UPDATE SKIP LOCKED
                ) x
            ) s
            -- end shared: keyed_slots
            -- The n-th job gets the n-th slot, and a limited key takes no more jobs than it
            -- locked slots. An unlimited key has no slots (NULL), and its jobs no slot.
            -- shared: keyed_ready
            CROSS JOIN LATERAL (
                SELECT r.id, r.lease_token, row_number() OVER () AS n FROM (
                    SELECT j.id, j.lease_token
                      FROM leaseq.jobs j
                     WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                       AND j.queue = k.queue AND j.key = k.key AND j.available_at <= coalesce(%(now)s::timestamptz, now())
                       AND (%(job_types)s::text[] IS NULL OR j.job_type = ANY(%(job_types)s::text[]))
                     ORDER BY j.priority, j.available_at, j.id
            -- end shared: keyed_ready
                     LIMIT CASE WHEN k.max_running IS NULL THEN %(limit)s
                                ELSE coalesce(cardinality(s.slots), 0) END
                       FOR UPDATE SKIP LOCKED
                ) r
            ) z
           WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
             -- A key's rate, read with this claim's snapshot: a rated key is never claimed
             -- here, whatever flow_limits showed.
             AND NOT k.rated
             AND (k.paused_until IS NULL OR k.paused_until <= coalesce(%(now)s::timestamptz, now()))
             AND (k.max_running IS NULL OR s.slots IS NOT NULL)
           ORDER BY k.vtime, k.key
           LIMIT %(limit)s
      ) c
     WHERE NOT (SELECT r.yes FROM rated r)
     LIMIT %(limit)s
),
-- shared: keyed_taken
taken AS (
    UPDATE leaseq.flow_slots s
       SET job_id = c.id, lease_token = leaseq.lease_token_next(c.lease_token, (SELECT leaseq.lease_epoch())), taken_at = coalesce(%(now)s::timestamptz, now())
      FROM candidate c
     WHERE s.id = ANY (ARRAY(SELECT x.slot FROM candidate x WHERE x.slot IS NOT NULL))
       AND s.id = c.slot
    RETURNING s.job_id
),
-- end shared: keyed_taken
-- shared: keyed_claimed
claimed AS (
    UPDATE leaseq.jobs j
       SET status = 'running',
           -- Whatever it waited for (ctx.wait_for) is over: it runs.
           waiting_for = NULL, waiting_since = NULL,
           attempt_count = j.attempt_count + 1,
           lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
           lease_owner = %(owner)s,
           claim_id = %(claim_id)s,
           -- Only the digest of the lease's secret, sha256(claim secret || id) (leaseq.core.capability).
           lease_digest = sha256(sha256(%(claim_secret)s::bytea || int8send(j.id))),
           started_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
           heartbeat_at = coalesce(%(now)s::timestamptz, now()),
           lease_expires_at = coalesce(%(now)s::timestamptz, now())
                              + least(make_interval(secs => %(lease_seconds)s),
                                      coalesce(j.timeout, make_interval(secs => %(lease_seconds)s)))
     WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
    RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
              j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
              extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
              j.idempotency_key, j.checkpoint
)
-- end shared: keyed_claimed
SELECT claimed.*, r.yes AS rated
  FROM rated r LEFT JOIN claimed ON true
 ORDER BY claimed.priority, claimed.available_at, claimed.id;

-- name: job_claim_keyed_open
-- Leases up to %(limit)s ready keyed jobs as job_claim_keyed does, from queues that have no limit or rate set (no such row in flow_limits): the same walk of their active keys by fair turn, without the slots and buckets that a limited key's claim locks and writes. Where one of the queues has one it claims nothing; every row says so in "limited" (and in "rated" whether a rate is among them), and a claim that took no job returns one row whose job fields are NULL.
-- Why a third statement: a generic plan sets up all of its nodes at every call, run or not,
-- and job_claim_keyed's slots, buckets and their two UPDATEs cost a keyed job on an unlimited
-- key 250,000 instructions of the server's 2.7 million (PostgreSQL 18.6, counted with an
-- instruction-counting profiler, claim and completion of one job at a time).
WITH limited AS (
    SELECT EXISTS (SELECT 1 FROM leaseq.flow_limits l
                    WHERE l.queue = ANY (%(queues)s::text[])
                      AND (l.max_running IS NOT NULL OR l.per_second IS NOT NULL)) AS yes
),
candidate AS (
    SELECT c.id
      FROM unnest(%(queues)s::text[]) AS q(queue)
      CROSS JOIN LATERAL (
          SELECT j.id
            FROM leaseq.flow_keys k
            CROSS JOIN LATERAL (
                SELECT j.id
                  FROM leaseq.jobs j
                 WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                   AND j.queue = k.queue AND j.key = k.key AND j.available_at <= coalesce(%(now)s::timestamptz, now())
                   AND (%(job_types)s::text[] IS NULL OR j.job_type = ANY(%(job_types)s::text[]))
                 ORDER BY j.priority, j.available_at, j.id
                 LIMIT %(limit)s
                   FOR UPDATE SKIP LOCKED
            ) j
           WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
             -- A key's own limit, read with this claim's snapshot as job_claim_keyed reads it:
             -- a limited key is never claimed here, whatever flow_limits showed.
             AND k.max_running IS NULL AND NOT k.rated
             AND (k.paused_until IS NULL OR k.paused_until <= coalesce(%(now)s::timestamptz, now()))
           ORDER BY k.vtime, k.key
           LIMIT %(limit)s
      ) c
     WHERE NOT (SELECT l.yes FROM limited l)
     LIMIT %(limit)s
),
-- shared: keyed_claimed
claimed AS (
    UPDATE leaseq.jobs j
       SET status = 'running',
           -- Whatever it waited for (ctx.wait_for) is over: it runs.
           waiting_for = NULL, waiting_since = NULL,
           attempt_count = j.attempt_count + 1,
           lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
           lease_owner = %(owner)s,
           claim_id = %(claim_id)s,
           -- Only the digest of the lease's secret, sha256(claim secret || id) (leaseq.core.capability).
           lease_digest = sha256(sha256(%(claim_secret)s::bytea || int8send(j.id))),
           started_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
           heartbeat_at = coalesce(%(now)s::timestamptz, now()),
           lease_expires_at = coalesce(%(now)s::timestamptz, now())
                              + least(make_interval(secs => %(lease_seconds)s),
                                      coalesce(j.timeout, make_interval(secs => %(lease_seconds)s)))
     WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
    RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
              j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
              extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
              j.idempotency_key, j.checkpoint
)
-- end shared: keyed_claimed
SELECT claimed.*, l.yes AS limited,
       -- Looked for only where a limit is: an open queue pays nothing for it.
       l.yes AND
       -- shared: queues_rated
       EXISTS (SELECT 1 FROM leaseq.flow_limits r
                WHERE r.queue = ANY (%(queues)s::text[]) AND r.per_second IS NOT NULL)
       -- end shared: queues_rated
       AS rated
  FROM limited l LEFT JOIN claimed ON true
 ORDER BY claimed.priority, claimed.available_at, claimed.id;

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
