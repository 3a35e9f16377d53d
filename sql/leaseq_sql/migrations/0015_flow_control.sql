-- leaseq schema: flow control (issue 20). Per-key concurrency limits held by slot rows, strict
-- order per aggregate, fair shares by weight charged in seconds run.
--
-- Per-key limits. A job may carry a key (jobs.key). A limit per queue and key, or key pattern
-- (`*` matches any run of characters; an exact key beats a pattern, a longer pattern beats a
-- shorter one), lives in leaseq.flow_limits and is applied to each key's row in
-- leaseq.flow_keys. A limited key has one row per unit of its limit in leaseq.flow_slots. The
-- claim (job_claim_keyed) takes a free slot with FOR UPDATE SKIP LOCKED in the same statement
-- that leases the job, and writes the holder (job id, new lease token) on it. The slot is
-- given back only by the trigger jobs_flow_release, in the same transaction as the job's row
-- leaving `running` (complete, fail, release, reap, cancel), and only if the slot's holder
-- token is the attempt's: a stale worker's fenced call changes no row, so it frees nothing.
-- A job waiting in retry backoff is pending, so it holds nothing. Lowering a limit retires the
-- excess slots (locked against claims in flight): running holders finish, nobody takes them.
-- Why slot rows: counting running jobs inside a SKIP LOCKED claim cannot see uncommitted
-- claims, and one counter row per key serialises every claim of a hot key.
--
-- Keyless jobs pay nothing: they stay in jobs_claim_idx (now without keyed rows) and touch no
-- flow table; every trigger here has a WHEN guard on the flow columns.
--
-- Strict order per aggregate. A job may carry an ordering_key: it gets the aggregate's next
-- ordering_seq (leaseq.flow_aggregates, locked by the enqueue), and is `ordering_waiting`
-- unless it is the aggregate's lowest unfinished job. Waiting jobs are in no claim index, so
-- only the head is claimable, one at a time. When the head succeeds or is cancelled, the next
-- sequence number (one index probe) stops waiting, in the same transaction. A dead head
-- blocks the aggregate (flow_aggregates.blocked_by) until it is retried (`leaseq jobs retry`)
-- or skipped (leaseq.flow_unblock).
--
-- Fair shares. Each key has a weight and a virtual time (flow_keys.vtime): the seconds its
-- jobs ran, divided by its weight, added when each attempt leaves `running`. The keyed claim
-- serves keys with work in order of vtime. A key that becomes active again starts at the
-- smallest vtime of the active keys of its queue: no saved-up burst, no starvation.

ALTER TABLE leaseq.jobs
    ADD COLUMN key text,
    ADD COLUMN ordering_key text,
    ADD COLUMN ordering_seq bigint,
    ADD COLUMN ordering_waiting boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT jobs_key_name CHECK (key IS NULL OR length(key) BETWEEN 1 AND 200),
    ADD CONSTRAINT jobs_ordering_key_name
        CHECK (ordering_key IS NULL OR length(ordering_key) BETWEEN 1 AND 200);

ALTER TABLE leaseq.job_history
    ADD COLUMN key text,
    ADD COLUMN ordering_key text,
    ADD COLUMN ordering_seq bigint,
    ADD COLUMN ordering_waiting boolean NOT NULL DEFAULT false;

-- The keyless claim's index keeps only keyless claimable rows; keyed rows have their own,
-- probed per key (never walked past a saturated key's backlog).
DROP INDEX leaseq.jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON leaseq.jobs (queue, priority, available_at, id)
    WHERE status = 'pending' AND key IS NULL AND NOT ordering_waiting;
CREATE INDEX jobs_key_claim_idx ON leaseq.jobs (queue, key, priority, available_at, id)
    WHERE status = 'pending' AND key IS NOT NULL AND NOT ordering_waiting;
-- The next head of an aggregate: one probe.
CREATE INDEX jobs_ordering_idx ON leaseq.jobs (queue, ordering_key, ordering_seq)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'running');
-- Unfinished keyed jobs: whether a key still has work (the release trigger, once per
-- finished attempt), its running jobs (status, limits applied to a key that runs).
CREATE INDEX jobs_key_unfinished_idx ON leaseq.jobs (queue, key)
    WHERE key IS NOT NULL AND status IN ('pending', 'running');

CREATE TABLE leaseq.flow_limits (
    queue       text NOT NULL,
    key_pattern text NOT NULL CONSTRAINT flow_limits_pattern CHECK (length(key_pattern) BETWEEN 1 AND 200),
    max_running integer CONSTRAINT flow_limits_max_running CHECK (max_running IS NULL OR max_running BETWEEN 0 AND 10000),
    weight      double precision NOT NULL DEFAULT 1 CONSTRAINT flow_limits_weight CHECK (weight > 0),
    -- Rate limit: starts per second, with a burst (the bucket's size); NULL: none.
    per_second  double precision CONSTRAINT flow_limits_rate CHECK (per_second IS NULL OR per_second > 0),
    burst       double precision CONSTRAINT flow_limits_burst CHECK (burst IS NULL OR burst >= 1),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key_pattern)
);

CREATE TABLE leaseq.flow_keys (
    queue       text NOT NULL,
    key         text NOT NULL,
    -- NULL: no concurrency limit (and no slot rows).
    max_running integer,
    weight      double precision NOT NULL DEFAULT 1,
    vtime       double precision NOT NULL DEFAULT 0,
    -- Has unfinished jobs (set by enqueue, cleared when its last attempt leaves running
    -- with nothing pending): the claim walks only active keys.
    active      boolean NOT NULL DEFAULT true,
    -- Has a rate limit (a row in leaseq.flow_buckets).
    rated       boolean NOT NULL DEFAULT false,
    -- Paused by a handler told to back off (leaseq.flow_pause): not claimed before then.
    paused_until timestamptz,
    PRIMARY KEY (queue, key)
) WITH (fillfactor = 70);

-- A rate-limited key's token bucket, taken and updated by the keyed claim in the statement
-- that starts its jobs (locked SKIP LOCKED: exact across workers).
CREATE TABLE leaseq.flow_buckets (
    queue      text NOT NULL,
    key        text NOT NULL,
    per_second double precision NOT NULL,
    burst      double precision NOT NULL,
    tokens     double precision NOT NULL,
    tokens_at  timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
) WITH (fillfactor = 50);

CREATE INDEX flow_keys_turn_idx ON leaseq.flow_keys (queue, vtime, key) WHERE active;

CREATE TABLE leaseq.flow_slots (
    queue       text NOT NULL,
    key         text NOT NULL,
    slot        integer NOT NULL,
    -- Slots past a lowered limit: drained by their holder, never taken again.
    retired     boolean NOT NULL DEFAULT false,
    job_id      bigint,
    lease_token bigint,
    taken_at    timestamptz,
    PRIMARY KEY (queue, key, slot),
    CONSTRAINT flow_slots_holder CHECK ((job_id IS NULL) = (lease_token IS NULL))
) WITH (fillfactor = 50);

CREATE INDEX flow_slots_free_idx ON leaseq.flow_slots (queue, key, slot)
    WHERE job_id IS NULL AND NOT retired;

-- Every keyed claim and release rewrites a slot row and (charging run time) its key's row,
-- whose indexes the claim walks: vacuum both after a fixed number of changes, unthrottled,
-- as leaseq.jobs is (migration 1), so a hot key's dead index entries stay few.
ALTER TABLE leaseq.flow_slots SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0);
ALTER TABLE leaseq.flow_keys SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0);
CREATE INDEX flow_slots_held_idx ON leaseq.flow_slots (job_id) WHERE job_id IS NOT NULL;

CREATE TABLE leaseq.flow_aggregates (
    queue        text NOT NULL,
    ordering_key text NOT NULL,
    next_seq     bigint NOT NULL DEFAULT 1,
    -- A dead head: the aggregate waits for it to be retried or skipped.
    blocked_by   bigint,
    blocked_at   timestamptz,
    PRIMARY KEY (queue, ordering_key)
);

CREATE INDEX flow_aggregates_blocked_idx ON leaseq.flow_aggregates (queue) WHERE blocked_by IS NOT NULL;

-- Counters the reaper's slot check adds to (repairs are expected to stay 0).
CREATE TABLE leaseq.flow_repairs (
    queue    text PRIMARY KEY,
    repaired bigint NOT NULL DEFAULT 0
);

-- The limit row that applies to (queue, key): an exact key first, then the longest pattern.
CREATE FUNCTION leaseq.flow_limit_for(q text, k text)
RETURNS leaseq.flow_limits
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT l.* FROM leaseq.flow_limits l
     WHERE l.queue = q
       AND (l.key_pattern = k
            OR k LIKE replace(replace(replace(replace(l.key_pattern, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'))
     ORDER BY l.key_pattern = k DESC, length(l.key_pattern) DESC, l.key_pattern
     LIMIT 1
$$;

-- Keeps the units past a lowered limit last: while a unit within the limit is free and one
-- past it is still held, the holder moves into the free unit and the extra unit goes. So a
-- key is claimable only once fewer jobs run than its limit (running ones drain, never cut).
CREATE FUNCTION leaseq.flow_compact(q text, k text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    free integer;
    extra record;
BEGIN
    DELETE FROM leaseq.flow_slots s
     WHERE s.queue = q AND s.key = k AND s.retired AND s.job_id IS NULL;
    LOOP
        SELECT s.slot INTO free FROM leaseq.flow_slots s
         WHERE s.queue = q AND s.key = k AND s.job_id IS NULL AND NOT s.retired
         ORDER BY s.slot LIMIT 1 FOR UPDATE SKIP LOCKED;
        EXIT WHEN free IS NULL;
        DELETE FROM leaseq.flow_slots s
         WHERE (s.queue, s.key, s.slot) = (
             SELECT x.queue, x.key, x.slot FROM leaseq.flow_slots x
              WHERE x.queue = q AND x.key = k AND x.retired AND x.job_id IS NOT NULL
              ORDER BY x.slot DESC LIMIT 1 FOR UPDATE SKIP LOCKED)
        RETURNING s.job_id, s.lease_token, s.taken_at INTO extra;
        EXIT WHEN extra IS NULL;
        UPDATE leaseq.flow_slots s
           SET job_id = extra.job_id, lease_token = extra.lease_token, taken_at = extra.taken_at
         WHERE s.queue = q AND s.key = k AND s.slot = free;
        free := NULL;
        extra := NULL;
    END LOOP;
END
$fn$;

-- Brings a key's row and slots in line with its limit (call with the key's row locked or
-- about to be): adds missing slots, un-retires or retires slots past the limit (waiting
-- for claims in flight that hold them), drops slots of a key that became unlimited, and
-- gives a slot to each running job of a key that just became limited.
CREATE FUNCTION leaseq.flow_apply(q text, k text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    lim leaseq.flow_limits := leaseq.flow_limit_for(q, k);
    was integer;
    n integer;
    r record;
BEGIN
    SELECT f.max_running INTO was FROM leaseq.flow_keys f WHERE f.queue = q AND f.key = k FOR UPDATE;
    n := lim.max_running;
    UPDATE leaseq.flow_keys f SET max_running = n, weight = coalesce(lim.weight, 1),
                                  rated = lim.per_second IS NOT NULL
     WHERE f.queue = q AND f.key = k;
    IF lim.per_second IS NULL THEN
        DELETE FROM leaseq.flow_buckets b WHERE b.queue = q AND b.key = k;
    ELSE
        INSERT INTO leaseq.flow_buckets AS b (queue, key, per_second, burst, tokens, tokens_at)
        VALUES (q, k, lim.per_second, coalesce(lim.burst, 1), coalesce(lim.burst, 1), now())
        ON CONFLICT (queue, key) DO UPDATE
           SET per_second = EXCLUDED.per_second, burst = EXCLUDED.burst,
               tokens = least(b.tokens, EXCLUDED.burst);
    END IF;
    IF n IS NULL THEN
        DELETE FROM leaseq.flow_slots s WHERE s.queue = q AND s.key = k;
        RETURN;
    END IF;
    INSERT INTO leaseq.flow_slots (queue, key, slot)
    SELECT q, k, g FROM generate_series(1, n) g
    ON CONFLICT (queue, key, slot) DO UPDATE SET retired = false WHERE leaseq.flow_slots.retired;
    UPDATE leaseq.flow_slots s SET retired = true
     WHERE s.queue = q AND s.key = k AND s.slot > n AND NOT s.retired;
    IF was IS NULL THEN
        -- Running jobs took no slot while the key was unlimited: each holds one now (past
        -- the limit: a retired extra slot), so the limit counts them.
        FOR r IN SELECT j.id, j.lease_token FROM leaseq.jobs j
                  WHERE j.status = 'running' AND j.queue = q AND j.key = k
                    AND NOT EXISTS (SELECT 1 FROM leaseq.flow_slots s WHERE s.job_id = j.id)
                  ORDER BY j.id LOOP
            UPDATE leaseq.flow_slots s SET job_id = r.id, lease_token = r.lease_token, taken_at = now()
             WHERE (s.queue, s.key, s.slot) = (
                 SELECT x.queue, x.key, x.slot FROM leaseq.flow_slots x
                  WHERE x.queue = q AND x.key = k AND x.job_id IS NULL AND NOT x.retired
                  ORDER BY x.slot LIMIT 1);
            IF NOT FOUND THEN
                INSERT INTO leaseq.flow_slots (queue, key, slot, retired, job_id, lease_token, taken_at)
                SELECT q, k, coalesce(max(s.slot), 0) + 1, true, r.id, r.lease_token, now()
                  FROM leaseq.flow_slots s WHERE s.queue = q AND s.key = k;
            END IF;
        END LOOP;
    END IF;
    PERFORM leaseq.flow_compact(q, k);
END
$fn$;

-- Sets (or, with remove, deletes) a limit and applies it to every key it now governs.
-- Returns how many keys were updated.
CREATE FUNCTION leaseq.flow_limit_set(q text, pattern text, max_running integer,
                                      weight double precision, per_second double precision,
                                      burst double precision, remove boolean)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    k text;
    n integer := 0;
BEGIN
    IF remove THEN
        DELETE FROM leaseq.flow_limits l WHERE l.queue = q AND l.key_pattern = pattern;
    ELSE
        INSERT INTO leaseq.flow_limits AS l (queue, key_pattern, max_running, weight, per_second,
                                             burst, updated_at)
        VALUES (q, pattern, max_running, coalesce(weight, 1), per_second,
                CASE WHEN per_second IS NULL THEN NULL ELSE coalesce(burst, 1) END, now())
        ON CONFLICT (queue, key_pattern) DO UPDATE
           SET max_running = EXCLUDED.max_running, weight = EXCLUDED.weight,
               per_second = EXCLUDED.per_second, burst = EXCLUDED.burst, updated_at = now();
    END IF;
    FOR k IN SELECT f.key FROM leaseq.flow_keys f
              WHERE f.queue = q
                AND (f.key = pattern
                     OR f.key LIKE replace(replace(replace(replace(pattern, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'))
              ORDER BY f.key LOOP
        PERFORM leaseq.flow_apply(q, k);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$fn$;

-- AFTER INSERT of a keyed job: the key's row exists and is active (a key back from idle
-- starts at the smallest vtime of its queue's active keys); a new key gets its slots.
CREATE FUNCTION leaseq.flow_on_enqueue()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    floor_vtime double precision;
    inserted boolean;
BEGIN
    SELECT min(f.vtime) INTO floor_vtime FROM leaseq.flow_keys f
     WHERE f.queue = NEW.queue AND f.active;
    INSERT INTO leaseq.flow_keys AS f (queue, key, vtime, active)
    VALUES (NEW.queue, NEW.key, coalesce(floor_vtime, 0), true)
    ON CONFLICT (queue, key) DO UPDATE
       SET active = true, vtime = greatest(f.vtime, coalesce(floor_vtime, f.vtime))
     WHERE NOT f.active
    RETURNING (f.xmax = 0) INTO inserted;
    IF inserted THEN
        PERFORM leaseq.flow_apply(NEW.queue, NEW.key);
    END IF;
    RETURN NULL;
END
$fn$;

-- BEFORE INSERT of an ordered job: its sequence number in the aggregate, and whether it waits
-- (the aggregate has an unfinished job, or is blocked by a dead head).
CREATE FUNCTION leaseq.flow_on_enqueue_ordered()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    seq bigint;
    blocked bigint;
BEGIN
    INSERT INTO leaseq.flow_aggregates AS a (queue, ordering_key, next_seq)
    VALUES (NEW.queue, NEW.ordering_key, 2)
    ON CONFLICT (queue, ordering_key) DO UPDATE SET next_seq = a.next_seq + 1
    RETURNING a.next_seq - 1, a.blocked_by INTO seq, blocked;
    NEW.ordering_seq := seq;
    -- A new statement, so a fresh snapshot: every job enqueued before the lock was taken
    -- is visible.
    NEW.ordering_waiting := blocked IS NOT NULL OR EXISTS (
        SELECT 1 FROM leaseq.jobs j
         WHERE j.queue = NEW.queue AND j.ordering_key = NEW.ordering_key
           AND j.status IN ('pending', 'running'));
    RETURN NEW;
END
$fn$;

-- AFTER UPDATE of a keyed job leaving running: frees the slot this attempt holds (its holder
-- token is the attempt's), charges the key for the seconds the attempt ran, deactivates a key
-- left with nothing unfinished, and wakes claimers.
CREATE FUNCTION leaseq.flow_on_leave_running()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- The key's row before the slot: the lock order of leaseq.flow_apply (no deadlock with a
    -- limit being lowered).
    UPDATE leaseq.flow_keys f
       SET vtime = f.vtime + greatest(extract(epoch FROM coalesce(NEW.finished_at, now()) - OLD.started_at), 0) / f.weight
     WHERE f.queue = OLD.queue AND f.key = OLD.key;
    UPDATE leaseq.flow_slots s SET job_id = NULL, lease_token = NULL, taken_at = NULL
     WHERE s.job_id = OLD.id AND s.lease_token = OLD.lease_token
       AND s.queue = OLD.queue AND s.key = OLD.key;
    -- A lowered limit still draining: keep its extra units last.
    IF EXISTS (SELECT 1 FROM leaseq.flow_slots s
                WHERE s.queue = OLD.queue AND s.key = OLD.key AND s.retired) THEN
        PERFORM leaseq.flow_compact(OLD.queue, OLD.key);
    END IF;
    IF NEW.status <> 'pending' THEN
        UPDATE leaseq.flow_keys f SET active = false
         WHERE f.queue = OLD.queue AND f.key = OLD.key AND f.active
           AND NOT EXISTS (SELECT 1 FROM leaseq.jobs j
                            WHERE j.queue = OLD.queue AND j.key = OLD.key
                              AND j.key IS NOT NULL AND j.status IN ('pending', 'running'));
    END IF;
    PERFORM pg_notify('leaseq_jobs', OLD.queue);
    RETURN NULL;
END
$fn$;

-- AFTER UPDATE of an aggregate's head leaving unfinished: the next sequence number becomes
-- claimable; a dead head blocks the aggregate instead.
CREATE FUNCTION leaseq.flow_on_head_done()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF NEW.status = 'dead' THEN
        UPDATE leaseq.flow_aggregates a SET blocked_by = NEW.id, blocked_at = now()
         WHERE a.queue = NEW.queue AND a.ordering_key = NEW.ordering_key;
        RETURN NULL;
    END IF;
    PERFORM leaseq.flow_promote(NEW.queue, NEW.ordering_key);
    RETURN NULL;
END
$fn$;

CREATE FUNCTION leaseq.flow_promote(q text, ok text)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    head bigint;
BEGIN
    -- The aggregate's row lock orders this against enqueues of the same aggregate.
    UPDATE leaseq.flow_aggregates a SET blocked_by = NULL, blocked_at = NULL
     WHERE a.queue = q AND a.ordering_key = ok;
    IF EXISTS (SELECT 1 FROM leaseq.jobs j
                WHERE j.queue = q AND j.ordering_key = ok AND j.status IN ('pending', 'running')
                  AND NOT j.ordering_waiting) THEN
        RETURN NULL;
    END IF;
    UPDATE leaseq.jobs j SET ordering_waiting = false
     WHERE j.id = (SELECT x.id FROM leaseq.jobs x
                    WHERE x.queue = q AND x.ordering_key = ok AND x.status IN ('pending', 'running')
                    ORDER BY x.ordering_seq LIMIT 1)
    RETURNING j.id INTO head;
    IF head IS NOT NULL THEN
        PERFORM pg_notify('leaseq_jobs', q);
    END IF;
    RETURN head;
END
$fn$;

-- A dead head retried: it is the head again, the aggregate is no longer blocked.
CREATE FUNCTION leaseq.flow_on_head_revived()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    UPDATE leaseq.flow_aggregates a SET blocked_by = NULL, blocked_at = NULL
     WHERE a.queue = NEW.queue AND a.ordering_key = NEW.ordering_key AND a.blocked_by = NEW.id;
    RETURN NULL;
END
$fn$;

-- A handler told to back off (HTTP 429, Retry-After) pauses its key until `until`: no job of
-- the key is claimed before then (a later pause wins; an earlier one never shortens it).
CREATE FUNCTION leaseq.flow_pause(q text, k text, until timestamptz)
RETURNS timestamptz
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE leaseq.flow_keys f SET paused_until = greatest(f.paused_until, until)
     WHERE f.queue = q AND f.key = k
    RETURNING f.paused_until
$$;

-- Skips a blocked aggregate's dead head: the next job runs. Returns the new head, if any.
CREATE FUNCTION leaseq.flow_unblock(q text, ok text)
RETURNS bigint
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT leaseq.flow_promote(q, ok) $$;

-- The reaper's check: every held slot belongs to a running attempt with the same token. Each
-- suspect slot is locked and checked again with a fresh snapshot (a claim or release in
-- flight is waited for, never mistaken for a leak), then freed. Returns the slots freed per
-- queue; adds them to leaseq.flow_repairs.
CREATE FUNCTION leaseq.flow_repair(batch integer)
RETURNS TABLE (queue text, repaired bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    s record;
    freed integer;
    queues text[] := ARRAY[]::text[];
BEGIN
    FOR s IN SELECT x.queue, x.key, x.slot, x.job_id, x.lease_token FROM leaseq.flow_slots x
              WHERE x.job_id IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM leaseq.jobs j
                                 WHERE j.id = x.job_id AND j.status = 'running'
                                   AND j.lease_token = x.lease_token
                                   AND j.queue = x.queue AND j.key = x.key)
              LIMIT batch LOOP
        PERFORM 1 FROM leaseq.flow_slots x
          WHERE (x.queue, x.key, x.slot) = (s.queue, s.key, s.slot) FOR UPDATE;
        UPDATE leaseq.flow_slots x SET job_id = NULL, lease_token = NULL, taken_at = NULL
         WHERE (x.queue, x.key, x.slot) = (s.queue, s.key, s.slot)
           AND x.job_id = s.job_id AND x.lease_token = s.lease_token
           AND NOT EXISTS (SELECT 1 FROM leaseq.jobs j
                            WHERE j.id = x.job_id AND j.status = 'running'
                              AND j.lease_token = x.lease_token);
        GET DIAGNOSTICS freed = ROW_COUNT;
        IF freed > 0 THEN
            queues := queues || s.queue;
        END IF;
    END LOOP;
    RETURN QUERY
    WITH c AS (SELECT u.q, count(*) AS n FROM unnest(queues) AS u(q) GROUP BY u.q),
    up AS (
        INSERT INTO leaseq.flow_repairs AS f (queue, repaired)
        SELECT c.q, c.n FROM c
        ON CONFLICT ON CONSTRAINT flow_repairs_pkey DO UPDATE SET repaired = f.repaired + EXCLUDED.repaired
    )
    SELECT c.q, c.n FROM c;
END
$fn$;

CREATE TRIGGER jobs_flow_enqueue AFTER INSERT ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.key IS NOT NULL) EXECUTE FUNCTION leaseq.flow_on_enqueue();
CREATE TRIGGER jobs_flow_enqueue_ordered BEFORE INSERT ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL) EXECUTE FUNCTION leaseq.flow_on_enqueue_ordered();
CREATE TRIGGER jobs_flow_release AFTER UPDATE ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND OLD.key IS NOT NULL)
    EXECUTE FUNCTION leaseq.flow_on_leave_running();
CREATE TRIGGER jobs_flow_head_done AFTER UPDATE ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL AND NOT OLD.ordering_waiting
                       AND OLD.status IN ('pending', 'running')
                       AND NEW.status IN ('succeeded', 'cancelled', 'dead'))
    EXECUTE FUNCTION leaseq.flow_on_head_done();
CREATE TRIGGER jobs_flow_head_revived AFTER UPDATE ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL AND OLD.status = 'dead' AND NEW.status = 'pending')
    EXECUTE FUNCTION leaseq.flow_on_head_revived();

-- The triggers and functions change flow tables that component roles cannot write: they run
-- as the owner (fixed search_path, every name qualified).
ALTER FUNCTION leaseq.flow_on_enqueue() SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_on_enqueue_ordered() SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_on_leave_running() SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_on_head_done() SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_on_head_revived() SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_promote(text, text) SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_apply(text, text) SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_compact(text, text) SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_limit_set(text, text, integer, double precision, double precision, double precision, boolean) SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_unblock(text, text) SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_pause(text, text, timestamptz) SECURITY DEFINER;
ALTER FUNCTION leaseq.flow_repair(integer) SECURITY DEFINER;
REVOKE ALL ON FUNCTION leaseq.flow_promote(text, text), leaseq.flow_apply(text, text),
    leaseq.flow_compact(text, text),
    leaseq.flow_limit_set(text, text, integer, double precision, double precision, double precision, boolean),
    leaseq.flow_unblock(text, text), leaseq.flow_repair(integer),
    leaseq.flow_pause(text, text, timestamptz) FROM PUBLIC;

-- Component roles: apply_grants of version 12 (pipelines) does everything it did, then:
-- worker:   the keyed claim reads the keys and takes slots (SELECT, UPDATE on flow_slots).
-- operator: sets limits, repairs slots, unblocks aggregates (the functions), reads it all.
-- producer: may set key and ordering_key on the jobs it enqueues.
ALTER FUNCTION leaseq.apply_grants(regrole, regrole, regrole) RENAME TO apply_grants_v12;

CREATE FUNCTION leaseq.apply_grants(worker regrole, operator regrole, producer regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    previous regrole[] := ARRAY(SELECT c.role_oid::regrole FROM leaseq.component_roles c
                                 WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid));
    r regrole;
    stmt text;
    stmts text[] := ARRAY[]::text[];
BEGIN
    RETURN QUERY SELECT s FROM leaseq.apply_grants_v12(worker, operator, producer) s;
    FOR r IN SELECT DISTINCT g FROM unnest(previous || ARRAY[worker, operator, producer]) g
              WHERE g IS NOT NULL LOOP
        stmts := stmts || format('REVOKE ALL ON FUNCTION leaseq.flow_limit_set(text, text, integer, double precision, double precision, double precision, boolean), leaseq.flow_unblock(text, text), leaseq.flow_repair(integer), leaseq.flow_pause(text, text, timestamptz) FROM %s', r);
    END LOOP;
    IF worker IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT ON leaseq.flow_keys, leaseq.flow_limits, leaseq.flow_aggregates TO %s', worker),
            format('GRANT SELECT, UPDATE (job_id, lease_token, taken_at) ON leaseq.flow_slots TO %s', worker),
            format('GRANT SELECT, UPDATE (tokens, tokens_at) ON leaseq.flow_buckets TO %s', worker),
            format('GRANT EXECUTE ON FUNCTION leaseq.flow_pause(text, text, timestamptz) TO %s', worker)];
    END IF;
    IF operator IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT ON leaseq.flow_keys, leaseq.flow_limits, leaseq.flow_slots, leaseq.flow_aggregates, leaseq.flow_repairs, leaseq.flow_buckets TO %s', operator),
            format('GRANT EXECUTE ON FUNCTION leaseq.flow_limit_set(text, text, integer, double precision, double precision, double precision, boolean), leaseq.flow_unblock(text, text), leaseq.flow_repair(integer) TO %s', operator)];
    END IF;
    IF producer IS NOT NULL THEN
        stmts := stmts || format('GRANT INSERT (key, ordering_key) ON leaseq.jobs TO %s', producer);
    END IF;
    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants(regrole, regrole, regrole) FROM PUBLIC;
