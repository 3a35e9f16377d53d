-- leaseq schema: a claim writes one digest of its secret on every job it takes, not one per
-- job, and a batch hashes each run of equal secrets once (issue 59's cost bound).
--
-- jobs.lease_digest is sha256(the claim's secret) now, not sha256(secret || id): the claimer
-- holds every lease of its call and nothing else holds any, so binding the digest to the id
-- told no holder from another. Every lease function checks sha256(secret) = lease_digest, as
-- before next to owner, token and an unexpired lease in database time; still SECURITY
-- DEFINER with a pinned search_path and revoked from PUBLIC. A new claim mints a new secret,
-- so a reissued lease never takes the old holder's. A completion clears the digest with the
-- lease: a finished row is as wide as before the capability (33 bytes less in the row and
-- in each completion's WAL).
--
-- Why: OpenSSL's sha256 as PostgreSQL 15 calls it (an EVP context set up per call) costs
-- about 7,000 server instructions, and a no-op job paid two (claim and completion): 241,800
-- server instructions per job against 228,700 before the capability (+5.8%; one session
-- claiming and completing 64 at a time, counted under callgrind by `python -m bench.trees
-- --callgrind-dumps`). With a hash per claim call, leaseq.lease_digests (sha256 once per
-- run of equal secrets) in lease_complete and lease_heartbeat_many, and the digest cleared
-- at completion: 226,000 (-1.2% against the version before the capability).
--
-- Also: a claim or renewal takes a lease of at most a day (86,400 s) whatever lease_seconds
-- its caller passes, so a worker login can no longer make the lease of a job without a
-- timeout outlive its death (issue 59).
--
-- A lease taken before this migration has a digest of the old form: its holder's next write
-- is refused as a lost lease's would be. Upgrade with the workers stopped.

CREATE OR REPLACE FUNCTION leaseq.lease_back_off(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, seconds double precision, reason text, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone, paused_until timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_back_off.at) AS now),
    released AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = greatest(j.available_at, leaseq.lease_run_at(t.now + make_interval(secs => lease_back_off.seconds))),
               attempt_count = j.attempt_count - 1,
               last_error = lease_back_off.reason, last_error_code = 'BACK_OFF',
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         -- No status: a lease exists only while a job runs (jobs_lease_only_while_running), and
         -- naming status = 'running' lets the planner pick jobs_running_idx over the primary
         -- key when the statistics predate the running jobs (test_fenced_plans.py).
         WHERE j.id = lease_back_off.job AND j.lease_owner = lease_back_off.holder
           AND j.lease_token = lease_back_off.token AND j.lease_digest = sha256(lease_back_off.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.key, j.available_at, j.attempt_count + 1 AS attempt
    ),
    paused AS (
        SELECT leaseq.flow_pause(r.queue, r.key, r.available_at) AS until
          FROM released r WHERE r.key IS NOT NULL
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT r.id, r.attempt, lease_back_off.token, lease_back_off.holder, lease_back_off.started,
               t.now, 'released', lease_back_off.reason
          FROM released r, t
    )
    SELECT r.id, 'pending'::text, r.available_at, (SELECT max(p.until) FROM paused p)
      FROM released r;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_checkpoint(job bigint, holder text, token bigint, secret bytea, state jsonb, at timestamp with time zone)
 RETURNS TABLE(id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET checkpoint = leaseq.lease_bounded('checkpoint', lease_checkpoint.state, 1048576)
     WHERE j.id = lease_checkpoint.job AND j.lease_owner = lease_checkpoint.holder
       AND j.lease_token = lease_checkpoint.token AND j.lease_digest = sha256(lease_checkpoint.secret)
       AND j.lease_expires_at > leaseq.lease_now(lease_checkpoint.at)
    RETURNING j.id;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_claim(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, trace_context jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, trace_context jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed_open(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, trace_context jsonb, limited boolean, rated boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed_slots(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, trace_context jsonb, rated boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_complete(jobs bigint[], holders text[], tokens bigint[], secrets bytea[], results jsonb[], effect_keys text[], progresses jsonb[], notes text[], at timestamp with time zone)
 RETURNS TABLE(id bigint, effect_key text, effect_written boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_complete.at) AS now),
    req AS (
        SELECT r.id, r.holder, r.token, r.digest, r.result, r.effect_key, r.progress, r.note
          FROM unnest(lease_complete.jobs, lease_complete.holders, lease_complete.tokens,
                      leaseq.lease_digests(lease_complete.secrets), lease_complete.results,
                      lease_complete.effect_keys, lease_complete.progresses,
                      lease_complete.notes)
               AS r(id, holder, token, digest, result, effect_key, progress, note)
    ),
    done AS (
        UPDATE leaseq.jobs j
           -- The digest goes with the lease: a finished row is as wide as before the capability
           -- (33 bytes less in the row and in the WAL of every completion).
           SET status = 'succeeded', finished_at = t.now, lease_expires_at = NULL, lease_digest = NULL,
               result = leaseq.lease_bounded('result', req.result, 1048576),
               progress = coalesce(leaseq.lease_bounded('progress', req.progress, 65536), j.progress)
          FROM t, req
         -- As in lease_heartbeat_many: the primary key whatever the plan.
         WHERE j.id = ANY (lease_complete.jobs)
           AND j.id = req.id AND j.lease_owner = req.holder
           AND j.lease_token = req.token AND j.lease_digest = req.digest
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.job_type, j.attempt_count, j.lease_token, j.lease_owner,
                  j.started_at, j.finished_at,
                  coalesce(req.effect_key, j.idempotency_key) AS effect_key,
                  req.result, req.note
    ),
    effect AS (
        INSERT INTO leaseq.job_results (queue, job_type, idempotency_key, job_id, produced_by,
                                        produced_at, result)
        SELECT done.queue, done.job_type, done.effect_key, done.id, done.lease_owner,
               done.finished_at, coalesce(done.result, 'null'::jsonb)
          FROM done
         WHERE done.effect_key IS NOT NULL
        ON CONFLICT (queue, job_type, idempotency_key) DO NOTHING
        RETURNING job_id
    ),
    -- A key another job's effect holds drops this one: the attempt says so, so it is not silent.
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT done.id, done.attempt_count, done.lease_token, done.lease_owner, done.started_at,
               done.finished_at, 'succeeded',
               CASE WHEN done.effect_key IS NOT NULL
                     AND NOT EXISTS (SELECT 1 FROM effect e WHERE e.job_id = done.id)
                    THEN concat_ws('; ', done.note, 'effect not written: its key is held by another job''s effect (keys are per queue and job type, shared by every producer)')
                    ELSE done.note END
          FROM done
    )
    SELECT done.id, done.effect_key,
           EXISTS (SELECT 1 FROM effect e WHERE e.job_id = done.id) AS effect_written
      FROM done;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_digests(secrets bytea[])
 RETURNS bytea[]
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
DECLARE
    digests bytea[] := secrets;
    digest bytea;
BEGIN
    FOR i IN 1 .. coalesce(pg_catalog.cardinality(secrets), 0) LOOP
        IF i = 1 OR secrets[i] IS DISTINCT FROM secrets[i - 1] THEN
            digest := pg_catalog.sha256(secrets[i]);
        END IF;
        digests[i] := digest;
    END LOOP;
    RETURN digests;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_digests(bytea[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_emit(job bigint, holder text, token bigint, secret bytea, item jsonb, cap integer, at timestamp with time zone)
 RETURNS TABLE(held boolean, seq bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_emit.job AND j.lease_owner = lease_emit.holder
           AND j.lease_token = lease_emit.token AND j.lease_digest = sha256(lease_emit.secret)
           AND j.lease_expires_at > leaseq.lease_now(lease_emit.at)
           FOR SHARE OF j
    ),
    -- The last item by a backward scan of the primary key: one index entry, however long the
    -- stream (an aggregate over the join read every item of the job at each append).
    last AS (
        SELECT held.id,
               coalesce((SELECT s.seq FROM leaseq.job_stream s WHERE s.job_id = held.id
                          ORDER BY s.seq DESC LIMIT 1), 0) AS seq
          FROM held
    ),
    ins AS (
        INSERT INTO leaseq.job_stream (job_id, seq, value, at)
        SELECT last.id, last.seq + 1, leaseq.lease_bounded('stream item', lease_emit.item, 65536),
               leaseq.lease_now(lease_emit.at)
          FROM last WHERE last.seq < least(lease_emit.cap, 10000)
        RETURNING seq
    )
    SELECT EXISTS (SELECT 1 FROM held), (SELECT ins.seq FROM ins);
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_fail(job bigint, holder text, token bigint, secret bytea, error text, error_code text, traceback text, retryable boolean, outcome leaseq.attempt_outcome, backoff_base double precision, backoff_cap double precision, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    IF lease_fail.outcome NOT IN ('failed', 'timed_out') THEN
        RAISE EXCEPTION 'a failed attempt''s outcome is failed or timed_out, got %; nothing was written', lease_fail.outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_fail.at) AS now),
    failed AS (
        UPDATE leaseq.jobs j
           SET status = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                             THEN 'pending' ELSE 'dead' END::leaseq.job_status,
               available_at = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                   THEN leaseq.lease_run_at(t.now + leaseq.retry_delay(j.attempt_count, lease_fail.backoff_base, lease_fail.backoff_cap))
                                   ELSE j.available_at END,
               finished_at = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                  THEN NULL ELSE t.now END,
               lease_owner = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                  THEN NULL ELSE j.lease_owner END,
               lease_expires_at = NULL,
               last_error = lease_fail.error,
               last_error_code = lease_fail.error_code
          FROM t
         WHERE j.id = lease_fail.job AND j.lease_owner = lease_fail.holder
           AND j.lease_token = lease_fail.token AND j.lease_digest = sha256(lease_fail.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.status, j.available_at, j.attempt_count, j.lease_token, j.started_at
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error,
                                         traceback)
        SELECT failed.id, failed.attempt_count, failed.lease_token, lease_fail.holder,
               failed.started_at, t.now, lease_fail.outcome, lease_fail.error, lease_fail.traceback
          FROM failed, t
    )
    SELECT failed.id, failed.status::text, failed.available_at FROM failed;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_heartbeat_many(jobs bigint[], holders text[], tokens bigint[], secrets bytea[], progresses jsonb[], lease_seconds double precision, at timestamp with time zone)
 RETURNS TABLE(id bigint, lease_expires_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    -- At most a day a renewal: a job without a timeout is still reclaimed if its worker
    -- dies, however long it asked for.
    lease_heartbeat_many.lease_seconds := least(lease_heartbeat_many.lease_seconds, 86400);
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET heartbeat_at = t.now,
           lease_expires_at = least(t.now + make_interval(secs => lease_heartbeat_many.lease_seconds),
                                    coalesce(j.started_at + least(j.timeout, interval '100 years'), 'infinity')),
           progress = coalesce(leaseq.lease_bounded('progress', r.progress, 65536), j.progress)
      FROM (SELECT leaseq.lease_now(lease_heartbeat_many.at) AS now) t,
           unnest(lease_heartbeat_many.jobs, lease_heartbeat_many.holders,
                  lease_heartbeat_many.tokens, leaseq.lease_digests(lease_heartbeat_many.secrets),
                  lease_heartbeat_many.progresses) AS r(id, holder, token, digest, progress)
     -- The ids as an array too: a probe of the primary key whatever the plan (joined only, a
     -- small table's generic plan hashed a scan of all of it).
     WHERE j.id = ANY (lease_heartbeat_many.jobs)
       AND j.id = r.id AND j.lease_owner = r.holder AND j.lease_token = r.token
       AND j.lease_digest = r.digest
       AND j.lease_expires_at > t.now
    RETURNING j.id, j.lease_expires_at;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_refused(job bigint, holder text, token bigint, secret bytea, attempt integer, started timestamp with time zone, call text, at timestamp with time zone)
 RETURNS TABLE(status leaseq.job_status, recorded bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH job AS (
        SELECT j.id, j.status, j.lease_token, j.lease_expires_at,
               coalesce(j.lease_digest = sha256(lease_refused.secret), false) AS proven
          FROM leaseq.jobs j WHERE j.id = lease_refused.job
    ),
    refusal AS (
        SELECT job.id, t.at,
               lease_refused.call || ' refused: ' ||
               CASE WHEN job.status = 'running' AND job.lease_token = lease_refused.token
                    THEN 'the lease of token ' || job.lease_token || ' expired at '
                         || job.lease_expires_at || ' (job is running, not reaped yet)'
                    ELSE 'lease token ' || lease_refused.token || ' is not current (job is '
                         || job.status || ', token ' || job.lease_token || ')'
               END AS error
          FROM job, (SELECT leaseq.lease_now(lease_refused.at) AS at) t
         WHERE job.proven OR job.lease_token <> lease_refused.token
    ),
    -- A plain UPDATE, not ON CONFLICT DO UPDATE: an attempt that is not lease_expired is
    -- skipped here. A cancelled attempt stays cancelled: its worker hearing so is the
    -- cancellation working, not a fault. The attempt ended when the reaper took it: its end
    -- time stays (a later one would show the attempt holding its key's unit after the reaper
    -- gave it back); the error says when the call came.
    refenced AS (
        UPDATE leaseq.job_attempts a
           SET outcome = 'fenced',
               error = refusal.error || ' at ' || refusal.at || ' after ' || a.outcome::text
          FROM refusal
         WHERE a.job_id = refusal.id AND a.lease_token = lease_refused.token
           AND a.outcome = 'lease_expired'
        RETURNING a.job_id
    ),
    inserted AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT refusal.id, lease_refused.attempt, lease_refused.token, lease_refused.holder,
               lease_refused.started, refusal.at, 'fenced', refusal.error
          FROM refusal
        ON CONFLICT (job_id, lease_token) DO NOTHING
        RETURNING job_id
    )
    SELECT (SELECT job.status FROM job),
           (SELECT count(*) FROM refenced) + (SELECT count(*) FROM inserted);
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_release(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, reason text, shutdown boolean, backoff_base double precision, backoff_cap double precision, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone, notified bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_release.at) AS now),
    released AS (
        UPDATE leaseq.jobs j
           SET status = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts
                             THEN 'dead' ELSE 'pending' END::leaseq.job_status,
               available_at = CASE WHEN lease_release.shutdown OR j.attempt_count >= j.max_attempts
                                   THEN j.available_at
                                   ELSE greatest(j.available_at,
                                                 leaseq.lease_run_at(t.now + leaseq.retry_delay(j.attempt_count, lease_release.backoff_base, lease_release.backoff_cap))) END,
               attempt_count = j.attempt_count - CASE WHEN lease_release.shutdown THEN 1 ELSE 0 END,
               finished_at = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts THEN t.now END,
               lease_owner = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts THEN j.lease_owner END,
               last_error = CASE WHEN lease_release.shutdown THEN j.last_error ELSE lease_release.reason END,
               last_error_code = CASE WHEN lease_release.shutdown THEN j.last_error_code ELSE 'INTERRUPTED' END,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         WHERE j.id = lease_release.job AND j.lease_owner = lease_release.holder
           AND j.lease_token = lease_release.token AND j.lease_digest = sha256(lease_release.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.status, j.available_at,
                  j.attempt_count + CASE WHEN lease_release.shutdown THEN 1 ELSE 0 END AS attempt
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT released.id, released.attempt, lease_release.token, lease_release.holder,
               lease_release.started, t.now,
               CASE WHEN lease_release.shutdown THEN 'released' ELSE 'interrupted' END::leaseq.attempt_outcome,
               lease_release.reason
          FROM released, t
    ),
    woke AS (SELECT pg_notify('leaseq_jobs', released.queue) FROM released WHERE released.status = 'pending')
    SELECT released.id, released.status::text, released.available_at,
           (SELECT count(*) FROM woke)
      FROM released;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_signal(job bigint, holder text, token bigint, secret bytea, signal_name text, at timestamp with time zone)
 RETURNS TABLE(found boolean, payload jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_signal.job AND j.lease_owner = lease_signal.holder
           AND j.lease_token = lease_signal.token AND j.lease_digest = sha256(lease_signal.secret)
           AND j.lease_expires_at > leaseq.lease_now(lease_signal.at)
    )
    SELECT s.job_id IS NOT NULL, s.payload
      FROM held
      LEFT JOIN leaseq.job_signals s ON s.job_id = held.id AND s.name = lease_signal.signal_name;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_sleep(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, until_at timestamp with time zone, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_sleep.at) AS now),
    slept AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = greatest(t.now, leaseq.lease_run_at(lease_sleep.until_at)),
               attempt_count = j.attempt_count - 1,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         WHERE j.id = lease_sleep.job AND j.lease_owner = lease_sleep.holder
           AND j.lease_token = lease_sleep.token AND j.lease_digest = sha256(lease_sleep.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.job_type, j.available_at, j.attempt_count + 1 AS attempt
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT s.id, s.attempt, lease_sleep.token, lease_sleep.holder, lease_sleep.started, t.now,
               'released', 'sleeping until ' || s.available_at
          FROM slept s, t
    ),
    woke AS (
        SELECT pg_notify('leaseq_jobs',
                         CASE WHEN s.available_at <= t.now THEN s.queue
                              ELSE s.queue || ' ' || extract(epoch FROM s.available_at - t.now)
                                   || ' ' || s.job_type END)
          FROM slept s, t
    )
    -- Joined to the count so that the notification is sent (a CTE nobody reads never runs).
    SELECT s.id, 'pending'::text, s.available_at FROM slept s, (SELECT count(*) FROM woke) w;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_spawn(job bigint, holder text, token bigint, secret bytea, name text, queues text[], job_types text[], payloads jsonb[], priorities smallint[], max_attempts integer[], run_ats timestamp with time zone[], delays double precision[], timeouts double precision[], idempotency_keys text[], deps_left integer[], has_children boolean[], keys text[], inherits boolean[], parents bigint[], children bigint[], afters text[], counted boolean[], at timestamp with time zone)
 RETURNS TABLE(pipeline_id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    spawner record;
    n integer := cardinality(lease_spawn.queues);
    ids bigint[];
    pipeline bigint;
    refused text;
BEGIN
    SELECT j.pipeline_id, j.key, j.enqueued_by, j.trace_context, leaseq.lease_now(lease_spawn.at) AS now
      INTO spawner
      FROM leaseq.jobs j
     WHERE j.id = lease_spawn.job AND j.lease_owner = lease_spawn.holder
       AND j.lease_token = lease_spawn.token AND j.status = 'running'
       AND j.lease_digest = sha256(lease_spawn.secret)
       AND j.lease_expires_at > leaseq.lease_now(lease_spawn.at);
    IF NOT FOUND OR n = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(lease_spawn.children) c WHERE c NOT BETWEEN -n AND -1)
       OR EXISTS (SELECT 1 FROM unnest(lease_spawn.parents) p WHERE p = 0 OR p < -n) THEN
        RAISE EXCEPTION 'a fan-out''s edges name its nodes as -1..-% and existing jobs by id', n
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'edges';
    END IF;
    SELECT q INTO refused FROM unnest(lease_spawn.queues) q
     WHERE NOT leaseq.queue_open_to(q, 'producer', spawner.enqueued_by) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'a fan-out of job % may not enqueue into queue %: the queue is given to other producer roles than its job''s producer', lease_spawn.job, refused
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    ids := ARRAY(SELECT nextval(pg_get_serial_sequence('leaseq.jobs', 'id'))
                   FROM generate_series(1, n));
    IF spawner.pipeline_id IS NULL THEN
        INSERT INTO leaseq.pipelines (name, total, created_at, created_by)
        VALUES (lease_spawn.name, n, spawner.now, spawner.enqueued_by)
        RETURNING leaseq.pipelines.id INTO pipeline;
    ELSE
        UPDATE leaseq.pipelines p SET total = p.total + n, finished_at = NULL
         WHERE p.id = spawner.pipeline_id;
        pipeline := spawner.pipeline_id;
    END IF;
    INSERT INTO leaseq.jobs (id, queue, job_type, payload, priority, max_attempts, available_at,
                             timeout, idempotency_key, created_at, status, deps_left,
                             has_children, pipeline_id, key, enqueued_by, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT ids[g.i], g.queue, g.job_type, g.payload, g.priority, g.max_attempts,
           coalesce(g.run_at, spawner.now + make_interval(secs => g.delay)),
           make_interval(secs => g.timeout), g.idempotency_key, spawner.now,
           CASE WHEN g.deps_left > 0 THEN 'waiting' ELSE 'pending' END::leaseq.job_status,
           g.deps_left, g.has_children, pipeline,
           CASE WHEN g.inherit THEN spawner.key ELSE g.key END, spawner.enqueued_by,
           spawner.trace_context
      FROM unnest(lease_spawn.queues, lease_spawn.job_types, lease_spawn.payloads,
                  lease_spawn.priorities, lease_spawn.max_attempts, lease_spawn.run_ats,
                  lease_spawn.delays, lease_spawn.timeouts, lease_spawn.idempotency_keys,
                  lease_spawn.deps_left, lease_spawn.has_children, lease_spawn.keys,
                  lease_spawn.inherits)
           WITH ORDINALITY AS g(queue, job_type, payload, priority, max_attempts, run_at,
                                delay, timeout, idempotency_key, deps_left, has_children,
                                key, inherit, i);
    INSERT INTO leaseq.job_deps (parent_id, child_id, after, counted)
    SELECT CASE WHEN e.parent < 0 THEN ids[-e.parent] ELSE e.parent END, ids[-e.child],
           e.after, e.counted
      FROM unnest(lease_spawn.parents, lease_spawn.children, lease_spawn.afters,
                  lease_spawn.counted) AS e(parent, child, after, counted);
    RETURN QUERY SELECT pipeline;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_spawn_lock(job bigint, holder text, token bigint, secret bytea, parents bigint[], at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, pipeline_id bigint, queue text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id, j.enqueued_by FROM leaseq.jobs j
         WHERE j.id = lease_spawn_lock.job AND j.lease_owner = lease_spawn_lock.holder
           AND j.lease_token = lease_spawn_lock.token AND j.status = 'running'
           AND j.lease_digest = sha256(lease_spawn_lock.secret)
           AND j.lease_expires_at > leaseq.lease_now(lease_spawn_lock.at)
           FOR UPDATE
    )
    UPDATE leaseq.jobs j SET has_children = true
      FROM held
     WHERE j.id = held.id
        OR (j.id = ANY(lease_spawn_lock.parents) AND j.enqueued_by = held.enqueued_by)
    RETURNING j.id, j.status::text, j.pipeline_id, j.queue;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_step_intend(job bigint, holder text, token bigint, secret bytea, step text, seen_token bigint, at timestamp with time zone)
 RETURNS TABLE(intended_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    IF length(lease_step_intend.step) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid step: must be a name of 1-200 characters; nothing was written'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'step',
                  DETAIL = 'must be a name of 1-200 characters';
    END IF;
    IF (SELECT count(*) FROM (SELECT 1 FROM leaseq.job_steps s
                               WHERE s.job_id = lease_step_intend.job AND s.name <> lease_step_intend.step
                               LIMIT 10000) n) >= 10000 THEN
        RAISE EXCEPTION 'invalid step: job % has recorded 10000 steps, the most a job records; nothing was written', lease_step_intend.job
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'step',
                  DETAIL = 'the job has 10000 steps, the most a job records: group work into fewer steps';
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_step_intend.at) AS now),
    held AS (
        SELECT j.id, j.attempt_count, j.lease_token FROM leaseq.jobs j, t
         WHERE j.id = lease_step_intend.job AND j.lease_owner = lease_step_intend.holder
           AND j.lease_token = lease_step_intend.token
           AND j.lease_digest = sha256(lease_step_intend.secret)
           AND j.lease_expires_at > t.now
           FOR SHARE OF j
    )
    INSERT INTO leaseq.job_steps AS s (job_id, name, attempt, lease_token, intended_at)
    SELECT held.id, lease_step_intend.step, held.attempt_count, held.lease_token, t.now FROM held, t
    ON CONFLICT (job_id, name) DO UPDATE
       SET attempt = excluded.attempt, lease_token = excluded.lease_token,
           intended_at = excluded.intended_at
     WHERE s.finished_at IS NULL AND s.lease_token IS NOT DISTINCT FROM lease_step_intend.seen_token
    RETURNING s.intended_at;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_step_record(job bigint, holder text, token bigint, secret bytea, step text, outcome jsonb, note text, at timestamp with time zone)
 RETURNS TABLE(finished_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_step_record.at) AS now),
    held AS (
        SELECT j.id FROM leaseq.jobs j, t
         WHERE j.id = lease_step_record.job AND j.lease_owner = lease_step_record.holder
           AND j.lease_token = lease_step_record.token
           AND j.lease_digest = sha256(lease_step_record.secret)
           AND j.lease_expires_at > t.now
           FOR SHARE OF j
    )
    UPDATE leaseq.job_steps s
       SET finished_at = t.now,
           result = leaseq.lease_bounded('step result', lease_step_record.outcome, 1048576),
           note = lease_step_record.note
      FROM held, t
     WHERE s.job_id = held.id AND s.name = lease_step_record.step
       AND s.lease_token = lease_step_record.token AND s.finished_at IS NULL
    RETURNING s.finished_at;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_step_withdraw(job bigint, holder text, token bigint, secret bytea, step text, at timestamp with time zone)
 RETURNS TABLE(name text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_step_withdraw.job AND j.lease_owner = lease_step_withdraw.holder
           AND j.lease_token = lease_step_withdraw.token
           AND j.lease_digest = sha256(lease_step_withdraw.secret)
           AND j.lease_expires_at > leaseq.lease_now(lease_step_withdraw.at)
           FOR SHARE OF j
    )
    UPDATE leaseq.job_steps s
       SET attempt = NULL, lease_token = NULL, intended_at = NULL
      FROM held
     WHERE s.job_id = held.id AND s.name = lease_step_withdraw.step
       AND s.lease_token = lease_step_withdraw.token AND s.finished_at IS NULL
    RETURNING s.name;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_wait(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, signal_name text, until_at timestamp with time zone, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone, signalled boolean, notified bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM FROM leaseq.jobs j
      WHERE j.id = lease_wait.job AND j.lease_owner = lease_wait.holder
        AND j.lease_token = lease_wait.token AND j.lease_digest = sha256(lease_wait.secret)
        AND j.lease_expires_at > leaseq.lease_now(lease_wait.at)
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_wait.at) AS now),
    sent AS (
        SELECT EXISTS (SELECT 1 FROM leaseq.job_signals s
                        WHERE s.job_id = lease_wait.job AND s.name = lease_wait.signal_name) AS there
    ),
    waited AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = CASE WHEN sent.there THEN t.now
                                   ELSE greatest(t.now, leaseq.lease_run_at(lease_wait.until_at)) END,
               waiting_for = lease_wait.signal_name, waiting_since = t.now,
               attempt_count = j.attempt_count - 1,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t, sent
         WHERE j.id = lease_wait.job AND j.lease_owner = lease_wait.holder
           AND j.lease_token = lease_wait.token AND j.lease_digest = sha256(lease_wait.secret)
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.available_at, j.attempt_count + 1 AS attempt, sent.there
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT w.id, w.attempt, lease_wait.token, lease_wait.holder, lease_wait.started, t.now,
               'released',
               CASE WHEN w.there THEN 'signal ' || quote_literal(lease_wait.signal_name) || ' arrived while handing back'
                    ELSE 'waiting for signal ' || quote_literal(lease_wait.signal_name) || ' until ' || w.available_at END
          FROM waited w, t
    ),
    -- The signal came first: claimable now, so say so.
    woke AS (SELECT pg_notify('leaseq_jobs', w.queue) FROM waited w WHERE w.there)
    SELECT w.id, 'pending'::text, w.available_at, w.there, (SELECT count(*) FROM woke)
      FROM waited w;
END
$function$
;
