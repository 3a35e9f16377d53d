-- leaseq's present tense: the claims, the worker's door to a lease.
--
-- Covers: leaseq.lease_claim (keyless jobs) and the keyed claims leaseq.lease_claim_keyed,
-- leaseq.lease_claim_keyed_slots and leaseq.lease_claim_keyed_open (flow control, migrations
-- 15 and 18).
-- Set off by: the named statements job_claim (queries/jobs.sql), job_claim_keyed,
-- job_claim_keyed_slots and job_claim_keyed_open (queries/flow.sql), run by the worker's
-- claim plan (leaseq.core.claims).
--
-- Each is SECURITY DEFINER, revoked from PUBLIC and granted to the worker role (apply_grants,
-- grants.sql), which has no UPDATE of its own on leaseq.jobs, flow_slots or flow_buckets: a
-- worker login leases a job only as these claims lease it (the next token, the attempt
-- counted, a lease of lease_seconds (at most a day) capped at the job's timeout, the digest of the claim's
-- secret). Each is one statement, so the plan a worker's session caches for it is a
-- statement's (tests/integration/test_flow_plans.py and test_crash_list.py read them). The
-- time is the database's, or `at` for the owner's logins (leaseq.lease_now); a claim's start
-- is clock_timestamp(), the moment its locks are held.
--
-- The three keyed claims are each written whole, so that each reads in one place. The pieces
-- they have in common are copies, each between the lines "-- shared: NAME" and
-- "-- end shared: NAME"; tests/unit/test_statements.py checks that every copy of a NAME is
-- the same SQL (comments, indentation and the function's name as a qualifier aside), so a
-- change to one fails until it is made to all. Why a piece is as it is is said once, in
-- lease_claim_keyed's copy.

-- Leases up to `lim` ready jobs from the given queues (of `job_types` only, unless NULL) in
-- priority order, skipping rows other claimers hold; bumps attempt and token.
CREATE OR REPLACE FUNCTION leaseq.lease_claim(queues text[], job_types text[], holder text,
                                              lim integer, lease_seconds double precision,
                                              claim_id uuid, claim_secret bytea, at timestamptz)
RETURNS TABLE (id bigint, queue text, job_type text, payload jsonb, priority smallint,
               available_at timestamptz, attempt_count integer, max_attempts integer,
               lease_token bigint, lease_expires_at timestamptz, started_at timestamptz,
               timeout_seconds double precision, idempotency_key text, checkpoint jsonb,
               trace_context jsonb)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim.at);
    claim_start timestamptz := CASE WHEN lease_claim.at IS NOT NULL THEN claim_now END;
    -- The digest of every lease this call takes (leaseq.core.capability): one hash per call.
    claim_digest bytea := sha256(lease_claim.claim_secret);
BEGIN
    lease_claim.queues := leaseq.lease_queues(lease_claim.queues);
    lease_claim.lease_seconds := least(lease_claim.lease_seconds, 86400);
    RETURN QUERY
    WITH candidate AS (
        SELECT c.id
          FROM unnest(lease_claim.queues) AS q(queue)
          CROSS JOIN LATERAL (
              SELECT j.id, j.priority, j.available_at
                FROM leaseq.jobs j
               WHERE j.status = 'pending' AND j.queue = q.queue AND j.available_at <= claim_now
                 -- Keyed and waiting ordered jobs are claimed by lease_claim_keyed (below).
                 AND j.key IS NULL AND NOT j.ordering_waiting
                 -- A filter on the claim index's scan, not a key of it: the index stays the one
                 -- every claimer walks; jobs of types this worker does not serve are stepped over.
                 AND (lease_claim.job_types IS NULL OR j.job_type = ANY(lease_claim.job_types))
               ORDER BY j.priority, j.available_at, j.id
               LIMIT lease_claim.lim
                 FOR UPDATE SKIP LOCKED
          ) c
         ORDER BY c.priority, c.available_at, c.id
         LIMIT lease_claim.lim
    ),
    claimed AS (
        UPDATE leaseq.jobs j
           SET status = 'running',
               -- Whatever it waited for (ctx.wait_for) is over: it runs.
               waiting_for = NULL, waiting_since = NULL,
               attempt_count = j.attempt_count + 1,
               lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
               lease_owner = lease_claim.holder,
               claim_id = lease_claim.claim_id,
               -- Only the lease's digest: sha256(the claim's secret), computed once per call.
               lease_digest = claim_digest,
               started_at = claim_now,
               heartbeat_at = claim_now,
               lease_expires_at = claim_now + least(make_interval(secs => lease_claim.lease_seconds),
                                                coalesce(j.timeout, make_interval(secs => lease_claim.lease_seconds)))
         -- An array, not a join: the generic plan cannot see LIMIT and would hash-join a
         -- sequential scan of jobs against the candidates; this plan is an index scan either way.
         WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
        RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
                  j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
                  extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
                  j.idempotency_key, j.checkpoint, j.trace_context
    )
    SELECT * FROM claimed ORDER BY priority, available_at, id;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_claim(text[], text[], text, integer, double precision, uuid, bytea, timestamptz) FROM PUBLIC;

-- Leases up to `lim` ready keyed jobs, walking the active keys of the given queues by fair turn
-- (vtime); a limited key's jobs are taken only with free slots of its limit (never more jobs than
-- slots), locked and written in the same statement; bumps attempt and token.
-- Now is the variable claim_now wherever it is needed, not a CTE joined into every part:
-- the generic plan has fewer nodes to set up at every claim (57 before, 44 now).
CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed(queues text[], job_types text[], holder text,
                                                    lim integer, lease_seconds double precision,
                                                    claim_id uuid, claim_secret bytea, at timestamptz)
RETURNS TABLE (id bigint, queue text, job_type text, payload jsonb, priority smallint,
               available_at timestamptz, attempt_count integer, max_attempts integer,
               lease_token bigint, lease_expires_at timestamptz, started_at timestamptz,
               timeout_seconds double precision, idempotency_key text, checkpoint jsonb,
               trace_context jsonb)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed.at IS NOT NULL THEN claim_now END;
    -- The digest of every lease this call takes (leaseq.core.capability): one hash per call.
    claim_digest bytea := sha256(lease_claim_keyed.claim_secret);
BEGIN
    lease_claim_keyed.queues := leaseq.lease_queues(lease_claim_keyed.queues);
    lease_claim_keyed.lease_seconds := least(lease_claim_keyed.lease_seconds, 86400);
    RETURN QUERY
    WITH candidate AS (
        SELECT c.id, c.queue, c.key, c.slot, c.bucket, c.lease_token, c.rated
          FROM unnest(lease_claim_keyed.queues) AS q(queue)
          CROSS JOIN LATERAL (
              SELECT k.queue, k.key, s.slots[j.n] AS slot, r.bucket, j.id, j.lease_token, k.rated
                FROM leaseq.flow_keys k
                -- shared: keyed_slots
                -- A limited key's free slots (their ids), locked, at most lease_claim_keyed.lim (NULL for an
                -- unlimited key). The slots first: a saturated key's pending rows are never read.
                CROSS JOIN LATERAL (
                    SELECT array_agg(x.id) AS slots FROM (
                        SELECT x.id FROM leaseq.flow_slots x
                         WHERE k.max_running IS NOT NULL
                           AND x.queue = k.queue AND x.key = k.key AND x.job_id IS NULL AND NOT x.retired
                         LIMIT lease_claim_keyed.lim
                           FOR UPDATE SKIP LOCKED
                    ) x
                ) s
                -- end shared: keyed_slots
                -- A rate-limited key's bucket, locked: its id and the starts it allows now (a
                -- bucket last filled at -infinity is full, one at infinity gains nothing).
                LEFT JOIN LATERAL (
                    SELECT b.id AS bucket, floor(least(b.burst, b.tokens + b.per_second
                                       * greatest(CASE WHEN isfinite(b.tokens_at) THEN extract(epoch FROM claim_now - b.tokens_at)
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
                           AND j.queue = k.queue AND j.key = k.key AND j.available_at <= claim_now
                           AND (lease_claim_keyed.job_types IS NULL OR j.job_type = ANY(lease_claim_keyed.job_types))
                         ORDER BY j.priority, j.available_at, j.id
                -- end shared: keyed_ready
                         LIMIT least(CASE WHEN k.max_running IS NULL THEN lease_claim_keyed.lim
                                          ELSE coalesce(cardinality(s.slots), 0) END,
                                     CASE WHEN k.rated THEN r.allows ELSE lease_claim_keyed.lim END)
                           FOR UPDATE SKIP LOCKED
                    ) r
                ) j
               WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
                 AND (k.paused_until IS NULL OR k.paused_until <= claim_now)
                 AND (k.max_running IS NULL OR s.slots IS NOT NULL)
                 AND (NOT k.rated OR r.allows >= 1)
               ORDER BY k.vtime, k.key
               LIMIT lease_claim_keyed.lim
          ) c
         LIMIT lease_claim_keyed.lim
    ),
    spent AS (
        UPDATE leaseq.flow_buckets b
           SET tokens = least(b.burst, b.tokens + b.per_second
                                       * greatest(CASE WHEN isfinite(b.tokens_at) THEN extract(epoch FROM claim_now - b.tokens_at)
                                                     WHEN b.tokens_at < 'epoch' THEN 'Infinity' END, 0)) - c.n,
               tokens_at = greatest(b.tokens_at, claim_now)
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
           SET job_id = c.id, lease_token = leaseq.lease_token_next(c.lease_token, (SELECT leaseq.lease_epoch())), taken_at = claim_now
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
               lease_owner = lease_claim_keyed.holder,
               claim_id = lease_claim_keyed.claim_id,
               -- Only the lease's digest: sha256(the claim's secret), computed once per call.
               lease_digest = claim_digest,
               -- The moment the claim holds its unit (its locks are taken before any row is
               -- updated), not the transaction's start: the attempts of one key never overlap
               -- beyond its limit, even for a claim that started before the unit was given back.
               started_at = coalesce(claim_start, clock_timestamp()),
               heartbeat_at = claim_now,
               lease_expires_at = claim_now
                                  + least(make_interval(secs => lease_claim_keyed.lease_seconds),
                                          coalesce(j.timeout, make_interval(secs => lease_claim_keyed.lease_seconds)))
         WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
        RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
                  j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
                  extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
                  j.idempotency_key, j.checkpoint, j.trace_context
    )
    -- end shared: keyed_claimed
    SELECT claimed.* FROM claimed ORDER BY priority, available_at, id;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_claim_keyed(text[], text[], text, integer, double precision, uuid, bytea, timestamptz) FROM PUBLIC;

-- Leases up to `lim` ready keyed jobs as lease_claim_keyed does, from queues that have no rate set
-- (no row of flow_limits with per_second): the same walk of their active keys by fair turn, a
-- limited key's jobs taken only with free slots of its limit (never more jobs than slots), without
-- the buckets that a rated key's claim locks and writes. Where one of the queues has a rate it
-- claims nothing; every row says so in "rated", and a claim that took no job returns one row whose
-- job fields are NULL.
-- Why a second statement: lease_claim_keyed's buckets and their UPDATE are set up at every
-- call of its generic plan. A claim and completion of one job of a key with a limit of 4
-- cost 2,036,000 server instructions by lease_claim_keyed, 1,942,000 by this one (PostgreSQL
-- 18.6, one job at a time, counted with an instruction-counting profiler; a keyless job
-- 1,199,000).
CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed_slots(queues text[], job_types text[], holder text,
                                                          lim integer, lease_seconds double precision,
                                                          claim_id uuid, claim_secret bytea, at timestamptz)
RETURNS TABLE (id bigint, queue text, job_type text, payload jsonb, priority smallint,
               available_at timestamptz, attempt_count integer, max_attempts integer,
               lease_token bigint, lease_expires_at timestamptz, started_at timestamptz,
               timeout_seconds double precision, idempotency_key text, checkpoint jsonb,
               trace_context jsonb, rated boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed_slots.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed_slots.at IS NOT NULL THEN claim_now END;
    -- The digest of every lease this call takes (leaseq.core.capability): one hash per call.
    claim_digest bytea := sha256(lease_claim_keyed_slots.claim_secret);
BEGIN
    lease_claim_keyed_slots.queues := leaseq.lease_queues(lease_claim_keyed_slots.queues);
    lease_claim_keyed_slots.lease_seconds := least(lease_claim_keyed_slots.lease_seconds, 86400);
    RETURN QUERY
    WITH rated AS (
        SELECT
        -- shared: queues_rated
        -- Whether one of the queues has a rate set: one probe of flow_limits_rated_idx
        -- (migration 27).
        EXISTS (SELECT 1 FROM leaseq.flow_limits r
                 WHERE r.queue = ANY (lease_claim_keyed_slots.queues) AND r.per_second IS NOT NULL)
        -- end shared: queues_rated
        AS yes
    ),
    candidate AS (
        SELECT c.id, c.queue, c.key, c.slot, c.lease_token
          FROM unnest(lease_claim_keyed_slots.queues) AS q(queue)
          CROSS JOIN LATERAL (
              SELECT k.queue, k.key, z.id, s.slots[z.n] AS slot, z.lease_token
                FROM leaseq.flow_keys k
                -- shared: keyed_slots
                CROSS JOIN LATERAL (
                    SELECT array_agg(x.id) AS slots FROM (
                        SELECT x.id FROM leaseq.flow_slots x
                         WHERE k.max_running IS NOT NULL
                           AND x.queue = k.queue AND x.key = k.key AND x.job_id IS NULL AND NOT x.retired
                         LIMIT lease_claim_keyed_slots.lim
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
                           AND j.queue = k.queue AND j.key = k.key AND j.available_at <= claim_now
                           AND (lease_claim_keyed_slots.job_types IS NULL OR j.job_type = ANY(lease_claim_keyed_slots.job_types))
                         ORDER BY j.priority, j.available_at, j.id
                -- end shared: keyed_ready
                         LIMIT CASE WHEN k.max_running IS NULL THEN lease_claim_keyed_slots.lim
                                    ELSE coalesce(cardinality(s.slots), 0) END
                           FOR UPDATE SKIP LOCKED
                    ) r
                ) z
               WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
                 -- A key's rate, read with this claim's snapshot: a rated key is never claimed
                 -- here, whatever flow_limits showed.
                 AND NOT k.rated
                 AND (k.paused_until IS NULL OR k.paused_until <= claim_now)
                 AND (k.max_running IS NULL OR s.slots IS NOT NULL)
               ORDER BY k.vtime, k.key
               LIMIT lease_claim_keyed_slots.lim
          ) c
         WHERE NOT (SELECT r.yes FROM rated r)
         LIMIT lease_claim_keyed_slots.lim
    ),
    -- shared: keyed_taken
    taken AS (
        UPDATE leaseq.flow_slots s
           SET job_id = c.id, lease_token = leaseq.lease_token_next(c.lease_token, (SELECT leaseq.lease_epoch())), taken_at = claim_now
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
               lease_owner = lease_claim_keyed_slots.holder,
               claim_id = lease_claim_keyed_slots.claim_id,
               -- Only the lease's digest: sha256(the claim's secret), computed once per call.
               lease_digest = claim_digest,
               started_at = coalesce(claim_start, clock_timestamp()),
               heartbeat_at = claim_now,
               lease_expires_at = claim_now
                                  + least(make_interval(secs => lease_claim_keyed_slots.lease_seconds),
                                          coalesce(j.timeout, make_interval(secs => lease_claim_keyed_slots.lease_seconds)))
         WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
        RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
                  j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
                  extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
                  j.idempotency_key, j.checkpoint, j.trace_context
    )
    -- end shared: keyed_claimed
    SELECT claimed.*, r.yes AS rated
      FROM rated r LEFT JOIN claimed ON true
     ORDER BY claimed.priority, claimed.available_at, claimed.id;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_claim_keyed_slots(text[], text[], text, integer, double precision, uuid, bytea, timestamptz) FROM PUBLIC;

-- Leases up to `lim` ready keyed jobs as lease_claim_keyed does, from queues that have no limit or
-- rate set (no such row in flow_limits): the same walk of their active keys by fair turn, without
-- the slots and buckets that a limited key's claim locks and writes. Where one of the queues has
-- one it claims nothing; every row says so in "limited" (and in "rated" whether a rate is among
-- them), and a claim that took no job returns one row whose job fields are NULL.
-- Why a third statement: a generic plan sets up all of its nodes at every call, run or not,
-- and lease_claim_keyed's slots, buckets and their two UPDATEs cost a keyed job on an unlimited
-- key 250,000 instructions of the server's 2.7 million (PostgreSQL 18.6, counted with an
-- instruction-counting profiler, claim and completion of one job at a time).
CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed_open(queues text[], job_types text[], holder text,
                                                         lim integer, lease_seconds double precision,
                                                         claim_id uuid, claim_secret bytea, at timestamptz)
RETURNS TABLE (id bigint, queue text, job_type text, payload jsonb, priority smallint,
               available_at timestamptz, attempt_count integer, max_attempts integer,
               lease_token bigint, lease_expires_at timestamptz, started_at timestamptz,
               timeout_seconds double precision, idempotency_key text, checkpoint jsonb,
               trace_context jsonb, limited boolean, rated boolean)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed_open.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed_open.at IS NOT NULL THEN claim_now END;
    -- The digest of every lease this call takes (leaseq.core.capability): one hash per call.
    claim_digest bytea := sha256(lease_claim_keyed_open.claim_secret);
BEGIN
    lease_claim_keyed_open.queues := leaseq.lease_queues(lease_claim_keyed_open.queues);
    lease_claim_keyed_open.lease_seconds := least(lease_claim_keyed_open.lease_seconds, 86400);
    RETURN QUERY
    WITH limited AS (
        SELECT EXISTS (SELECT 1 FROM leaseq.flow_limits l
                        WHERE l.queue = ANY (lease_claim_keyed_open.queues)
                          AND (l.max_running IS NOT NULL OR l.per_second IS NOT NULL)) AS yes
    ),
    candidate AS (
        SELECT c.id
          FROM unnest(lease_claim_keyed_open.queues) AS q(queue)
          CROSS JOIN LATERAL (
              SELECT j.id
                FROM leaseq.flow_keys k
                CROSS JOIN LATERAL (
                    SELECT j.id
                      FROM leaseq.jobs j
                     WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                       AND j.queue = k.queue AND j.key = k.key AND j.available_at <= claim_now
                       AND (lease_claim_keyed_open.job_types IS NULL OR j.job_type = ANY(lease_claim_keyed_open.job_types))
                     ORDER BY j.priority, j.available_at, j.id
                     LIMIT lease_claim_keyed_open.lim
                       FOR UPDATE SKIP LOCKED
                ) j
               WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
                 -- A key's own limit, read with this claim's snapshot as lease_claim_keyed reads it:
                 -- a limited key is never claimed here, whatever flow_limits showed.
                 AND k.max_running IS NULL AND NOT k.rated
                 AND (k.paused_until IS NULL OR k.paused_until <= claim_now)
               ORDER BY k.vtime, k.key
               LIMIT lease_claim_keyed_open.lim
          ) c
         WHERE NOT (SELECT l.yes FROM limited l)
         LIMIT lease_claim_keyed_open.lim
    ),
    -- shared: keyed_claimed
    claimed AS (
        UPDATE leaseq.jobs j
           SET status = 'running',
               -- Whatever it waited for (ctx.wait_for) is over: it runs.
               waiting_for = NULL, waiting_since = NULL,
               attempt_count = j.attempt_count + 1,
               lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
               lease_owner = lease_claim_keyed_open.holder,
               claim_id = lease_claim_keyed_open.claim_id,
               -- Only the lease's digest: sha256(the claim's secret), computed once per call.
               lease_digest = claim_digest,
               started_at = coalesce(claim_start, clock_timestamp()),
               heartbeat_at = claim_now,
               lease_expires_at = claim_now
                                  + least(make_interval(secs => lease_claim_keyed_open.lease_seconds),
                                          coalesce(j.timeout, make_interval(secs => lease_claim_keyed_open.lease_seconds)))
         WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
        RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
                  j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
                  extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
                  j.idempotency_key, j.checkpoint, j.trace_context
    )
    -- end shared: keyed_claimed
    SELECT claimed.*, l.yes AS limited,
           -- Looked for only where a limit is: an open queue pays nothing for it.
           l.yes AND
           -- shared: queues_rated
           EXISTS (SELECT 1 FROM leaseq.flow_limits r
                    WHERE r.queue = ANY (lease_claim_keyed_open.queues) AND r.per_second IS NOT NULL)
           -- end shared: queues_rated
           AS rated
      FROM limited l LEFT JOIN claimed ON true
     ORDER BY claimed.priority, claimed.available_at, claimed.id;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.lease_claim_keyed_open(text[], text[], text, integer, double precision, uuid, bytea, timestamptz) FROM PUBLIC;
