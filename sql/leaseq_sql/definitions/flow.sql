-- leaseq's present tense: flow control (per-key limits, rates, fair shares, strict order)
-- and the one status trigger of leaseq.jobs that gives a key's unit back.
--
-- A job's key, from enqueue to the limit's release, in three files: job_enqueue
-- (queries/jobs.sql) inserts it and jobs_flow_enqueue activates the key (flow_activate,
-- flow_apply, below); job_claim_keyed_open, job_claim_keyed_slots or job_claim_keyed
-- (queries/flow.sql) take a unit; the completion, failure, release or reap in
-- queries/jobs.sql changes the status, and jobs_on_status (below) gives the unit back in
-- that same transaction.
--
-- Covers: every leaseq.flow_* function, the enqueue triggers jobs_flow_enqueue and
-- jobs_flow_enqueue_ordered, and jobs_on_status (also the waiters' notify and the pipelines'
-- dispatch to pipeline_changed, pipelines.sql). Set off by: the statements above, and
-- flow_limit_set, flow_pause, flow_resume, flow_unblock, flow_repair, job_back_off
-- (queries/flow.sql).

-- The limit row that applies to (queue, key): an exact key first, then the longest pattern.
CREATE OR REPLACE FUNCTION leaseq.flow_limit_for(q text, k text)
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

-- Whether a key has a pending job: one claimable (jobs_key_claim_idx, read from its tail:
-- the entries its claimed jobs left behind until vacuum are at its head) or one waiting its
-- aggregate's turn (jobs_key_held_idx, newest first). STABLE: it reads with the snapshot of
-- the statement that calls it.
CREATE OR REPLACE FUNCTION leaseq.flow_key_pending(q text, k text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN (SELECT j.id FROM leaseq.jobs j
             WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
               AND j.queue = q AND j.key = k
             ORDER BY j.priority DESC, j.available_at DESC, j.id DESC LIMIT 1) IS NOT NULL
        OR (SELECT j.id FROM leaseq.jobs j
             WHERE j.status = 'pending' AND j.key IS NOT NULL AND j.ordering_waiting
               AND j.queue = q AND j.key = k
             ORDER BY j.id DESC LIMIT 1) IS NOT NULL;
END
$fn$;

-- A key with a pending job is active and in turn (awake: a key asleep until its next job,
-- flow_settle, wakes now): its row exists (limits applied from flow_limits) and its virtual
-- time starts at the floor of the queue's keys in turn, so a new key neither waits behind
-- nor jumps ahead of the others' fair share.
CREATE OR REPLACE FUNCTION leaseq.flow_activate(q text, k text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    floor_vtime double precision;
    inserted boolean;
BEGIN
    SELECT min(f.vtime) INTO floor_vtime FROM leaseq.flow_keys f
     WHERE f.queue = q AND f.active AND f.next_at IS NULL;
    INSERT INTO leaseq.flow_keys AS f (queue, key, vtime, active)
    VALUES (q, k, coalesce(floor_vtime, 0), true)
    ON CONFLICT (queue, key) DO UPDATE
       SET active = true, next_at = NULL, vtime = greatest(f.vtime, coalesce(floor_vtime, f.vtime))
     WHERE NOT f.active OR f.next_at IS NOT NULL
    RETURNING (f.xmax = 0) INTO inserted;
    IF inserted THEN
        PERFORM leaseq.flow_apply(q, k);
    END IF;
END
$fn$;

-- Applies the limit that governs (q, k) to the key's row and its units; a key's running jobs
-- are read from jobs_key_held_idx.
CREATE OR REPLACE FUNCTION leaseq.flow_apply(q text, k text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
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
                  WHERE j.status = 'running' AND j.key IS NOT NULL AND j.queue = q AND j.key = k
                    AND NOT EXISTS (SELECT 1 FROM leaseq.flow_slots s
                                     WHERE s.queue = q AND s.key = k AND s.job_id = j.id)
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

-- Keeps the units past a lowered limit last: while a unit within the limit is free and one
-- past it is still held, the holder moves into the free unit and the extra unit goes. So a
-- key is claimable only once fewer jobs run than its limit (running ones drain, never cut).
CREATE OR REPLACE FUNCTION leaseq.flow_compact(q text, k text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
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

REVOKE ALL ON FUNCTION leaseq.flow_activate(text, text), leaseq.flow_apply(text, text),
    leaseq.flow_compact(text, text) FROM PUBLIC;

-- AFTER INSERT of a keyed job: the key becomes active (its re-activation on update is
-- jobs_on_status's).
CREATE OR REPLACE FUNCTION leaseq.flow_on_enqueue()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM leaseq.flow_activate(NEW.queue, NEW.key);
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE TRIGGER jobs_flow_enqueue AFTER INSERT ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.key IS NOT NULL) EXECUTE FUNCTION leaseq.flow_on_enqueue();
-- EXECUTE on a trigger function is checked only by CREATE TRIGGER, and any role may create a
-- trigger on a temporary table of its own: a SECURITY DEFINER trigger function that PUBLIC
-- may execute runs the owner's code on rows the caller forged. The same holds for the two
-- below.
REVOKE ALL ON FUNCTION leaseq.flow_on_enqueue() FROM PUBLIC;

-- BEFORE INSERT of an ordered job: its sequence number in the aggregate, and whether it waits
-- (the aggregate has an unfinished job, or is blocked by a dead head).
CREATE OR REPLACE FUNCTION leaseq.flow_on_enqueue_ordered()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
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
           AND j.status IN ('pending', 'running'))
        -- A head held at an uncertain step is unfinished: nothing behind it starts, as behind
        -- a dead one. Through jobs_held_idx (its predicate: only a held job is unfinished in
        -- none of these statuses); held jobs are few.
        OR EXISTS (
        SELECT 1 FROM leaseq.jobs j
         WHERE j.finished_at IS NULL AND j.status NOT IN ('waiting', 'pending', 'running')
           AND j.queue = NEW.queue AND j.ordering_key = NEW.ordering_key);
    RETURN NEW;
END
$fn$;

CREATE OR REPLACE TRIGGER jobs_flow_enqueue_ordered BEFORE INSERT ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL) EXECUTE FUNCTION leaseq.flow_on_enqueue_ordered();
REVOKE ALL ON FUNCTION leaseq.flow_on_enqueue_ordered() FROM PUBLIC;

-- The next job of an ordered aggregate becomes claimable once its head finished (or was
-- skipped): the lowest waiting sequence number. Returns the new head, if any.
CREATE OR REPLACE FUNCTION leaseq.flow_promote(q text, ok text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
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
                  AND NOT j.ordering_waiting)
       -- A held head (jobs_held_idx, as in flow_on_enqueue_ordered).
       OR EXISTS (SELECT 1 FROM leaseq.jobs j
                   WHERE j.finished_at IS NULL AND j.status NOT IN ('waiting', 'pending', 'running')
                     AND j.queue = q AND j.ordering_key = ok) THEN
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

-- Skips a blocked aggregate's dead head: the next job runs. Returns the new head, if any.
CREATE OR REPLACE FUNCTION leaseq.flow_unblock(q text, ok text)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT leaseq.flow_promote(q, ok) $$;

-- Sets (or, with remove, deletes) a limit and applies it to every key it now governs.
-- Returns how many keys were updated.
CREATE OR REPLACE FUNCTION leaseq.flow_limit_set(q text, pattern text, max_running integer,
                                      weight double precision, per_second double precision,
                                      burst double precision, remove boolean)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
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

-- A handler told to back off (HTTP 429, Retry-After) pauses its key until `until`: no job of
-- the key is claimed before then (a later pause wins; an earlier one never shortens it).
-- `until` is clamped to [now, now + 1 day]: a garbage Retry-After (or a worker calling this
-- with 'infinity') pauses a key for a day at most, and never writes a time no reader can
-- subtract from; `leaseq limits resume` ends a pause early.
CREATE OR REPLACE FUNCTION leaseq.flow_pause(q text, k text, until timestamptz)
RETURNS timestamptz
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE leaseq.flow_keys f
       SET paused_until = greatest(f.paused_until, least(greatest(until, now()), now() + interval '1 day'))
     WHERE f.queue = q AND f.key = k
    RETURNING f.paused_until
$$;

-- Ends a key's pause now (`leaseq limits resume`), and wakes it if it slept through the
-- pause (flow_settle); returns whether the key had one.
CREATE OR REPLACE FUNCTION leaseq.flow_resume(q text, k text)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH resumed AS (
        UPDATE leaseq.flow_keys f SET paused_until = NULL, next_at = NULL
         WHERE f.queue = q AND f.key = k AND f.paused_until IS NOT NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM resumed)
$$;

-- The reaper's check: every held slot belongs to a running attempt with the same token. Each
-- suspect slot is locked and checked again with a fresh snapshot (a claim or release in
-- flight is waited for, never mistaken for a leak), then freed. Returns the slots freed per
-- queue; adds them to leaseq.flow_repairs.
CREATE OR REPLACE FUNCTION leaseq.flow_repair(batch integer)
RETURNS TABLE (queue text, repaired bigint)
LANGUAGE plpgsql
SECURITY DEFINER
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

-- The reaper's sweep of the keys at the front of each queue's turn, where claims start.
-- Only a key's last running job deactivates it when it ends (jobs_on_status), so a key whose
-- jobs ended without running (cancelled while pending, or waiting and cancelled by a
-- cascade) stayed active; and a key whose only jobs are due later (delayed, sleeping,
-- waiting for a signal, backing off, paused) stayed in the turn. Such keys stay first in
-- turn (never charged again), and every claim of the queue walked them and probed their
-- jobs: 10,000 keys with a job due tomorrow made a keyed claim 28 times slower.
-- First it wakes the sleeping keys whose next job is due within `ahead` seconds (next_at
-- back to NULL: in the turn again). Then, of each queue's first `batch` keys in turn, a key
-- with no pending job and none running is deactivated, and a key with none running, none
-- waiting for its aggregate's turn, and no job due within 2 x `ahead` seconds sleeps until
-- its first job is due (next_at: the later of that job's time and the key's pause). Each is
-- locked (a key a release or an enqueue holds is skipped) and checked again by a new
-- statement under the lock, as the release's last job checks: an enqueue that committed
-- since is seen, and one still in flight waits for the lock and then activates (or wakes)
-- the key. A key whose jobs all wait for their parents goes idle too: the first that becomes
-- pending activates it; a signal to a waiting job, an enqueue and a resume wake a sleeping
-- key at once (flow_activate). Returns per queue the keys deactivated, put to sleep, woken.
CREATE OR REPLACE FUNCTION leaseq.flow_settle(batch integer, ahead double precision)
RETURNS TABLE (queue text, settled bigint, slept bigint, woken bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    c record;
    done integer;
    wake_by timestamptz := now() + make_interval(secs => ahead);
    sleep_past timestamptz := now() + make_interval(secs => 2 * ahead);
    queues text[];
    kinds text[];
BEGIN
    WITH woke AS (
        UPDATE leaseq.flow_keys f SET next_at = NULL
         WHERE f.next_at IS NOT NULL AND f.next_at <= wake_by
        RETURNING f.queue
    )
    SELECT coalesce(array_agg(woke.queue), '{}'), coalesce(array_agg('woken'::text), '{}')
      INTO queues, kinds FROM woke;
    FOR c IN
        -- Each queue with a key in turn (flow_keys_turn_idx, one probe per queue), then its
        -- first keys in turn.
        WITH RECURSIVE qs (q) AS (
            (SELECT f.queue FROM leaseq.flow_keys f
              WHERE f.active AND f.next_at IS NULL ORDER BY f.queue LIMIT 1)
            UNION ALL
            SELECT (SELECT f.queue FROM leaseq.flow_keys f
                     WHERE f.active AND f.next_at IS NULL AND f.queue > qs.q
                     ORDER BY f.queue LIMIT 1)
              FROM qs WHERE qs.q IS NOT NULL
        )
        SELECT k.queue, k.key, k.paused_until,
               leaseq.flow_key_pending(k.queue, k.key) AS pending,
               EXISTS (SELECT 1 FROM leaseq.jobs j
                        WHERE j.status = 'running' AND j.key IS NOT NULL
                          AND j.queue = k.queue AND j.key = k.key) AS running,
               EXISTS (SELECT 1 FROM leaseq.jobs j
                        WHERE j.status = 'pending' AND j.key IS NOT NULL AND j.ordering_waiting
                          AND j.queue = k.queue AND j.key = k.key) AS ordered,
               (SELECT min(j.available_at) FROM leaseq.jobs j
                 WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                   AND j.queue = k.queue AND j.key = k.key) AS first_at
          FROM qs
         CROSS JOIN LATERAL (SELECT f.queue, f.key, f.paused_until FROM leaseq.flow_keys f
                              WHERE f.active AND f.next_at IS NULL AND f.queue = qs.q
                              ORDER BY f.vtime, f.key LIMIT batch) k
         WHERE qs.q IS NOT NULL
    LOOP
        CONTINUE WHEN c.running;
        CONTINUE WHEN c.pending AND (c.ordered OR c.first_at IS NULL
                                     OR greatest(c.first_at, c.paused_until) <= sleep_past);
        PERFORM 1 FROM leaseq.flow_keys f
          WHERE (f.queue, f.key) = (c.queue, c.key) FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        IF NOT c.pending THEN
            UPDATE leaseq.flow_keys f SET active = false
             WHERE (f.queue, f.key) = (c.queue, c.key) AND f.active
               AND NOT leaseq.flow_key_pending(c.queue, c.key)
               AND NOT EXISTS (SELECT 1 FROM leaseq.jobs j
                                WHERE j.status = 'running' AND j.key IS NOT NULL
                                  AND j.queue = c.queue AND j.key = c.key);
        ELSE
            UPDATE leaseq.flow_keys f SET next_at = greatest(f.paused_until, s.first_at)
              FROM (SELECT min(j.available_at) AS first_at FROM leaseq.jobs j
                     WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                       AND j.queue = c.queue AND j.key = c.key) s
             WHERE (f.queue, f.key) = (c.queue, c.key) AND f.active AND f.next_at IS NULL
               AND s.first_at IS NOT NULL
               AND greatest(f.paused_until, s.first_at) > sleep_past
               AND NOT EXISTS (SELECT 1 FROM leaseq.jobs j
                                WHERE j.status = 'running' AND j.key IS NOT NULL
                                  AND j.queue = c.queue AND j.key = c.key)
               AND NOT EXISTS (SELECT 1 FROM leaseq.jobs j
                                WHERE j.status = 'pending' AND j.key IS NOT NULL
                                  AND j.ordering_waiting
                                  AND j.queue = c.queue AND j.key = c.key);
        END IF;
        GET DIAGNOSTICS done = ROW_COUNT;
        IF done > 0 THEN
            queues := queues || c.queue;
            kinds := kinds || CASE WHEN c.pending THEN 'slept' ELSE 'settled' END;
        END IF;
    END LOOP;
    RETURN QUERY
    SELECT u.q, count(*) FILTER (WHERE u.kind = 'settled'), count(*) FILTER (WHERE u.kind = 'slept'),
           count(*) FILTER (WHERE u.kind = 'woken')
      FROM unnest(queues, kinds) AS u(q, kind) GROUP BY u.q;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.flow_promote(text, text), leaseq.flow_unblock(text, text),
    leaseq.flow_limit_set(text, text, integer, double precision, double precision, double precision, boolean),
    leaseq.flow_pause(text, text, timestamptz), leaseq.flow_resume(text, text),
    leaseq.flow_repair(integer), leaseq.flow_settle(integer, double precision) FROM PUBLIC;

-- The one status trigger's function: each branch is what one of the six triggers before
-- migration 26 did, tested in its own condition. SECURITY DEFINER: it changes tables the
-- component roles cannot write.
CREATE OR REPLACE FUNCTION leaseq.jobs_on_status()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- jobs_flow_head_done: the head of an aggregate finished.
    IF OLD.ordering_key IS NOT NULL AND NOT OLD.ordering_waiting AND OLD.finished_at IS NULL
       AND NEW.finished_at IS NOT NULL AND OLD.status <> 'waiting' THEN
        IF NEW.status = 'dead' THEN
            UPDATE leaseq.flow_aggregates a SET blocked_by = NEW.id, blocked_at = now()
             WHERE a.queue = NEW.queue AND a.ordering_key = NEW.ordering_key;
        ELSE
            PERFORM leaseq.flow_promote(NEW.queue, NEW.ordering_key);
        END IF;
    END IF;
    -- jobs_flow_head_revived: a dead head retried.
    IF OLD.ordering_key IS NOT NULL AND OLD.status = 'dead' AND NEW.status = 'pending' THEN
        UPDATE leaseq.flow_aggregates a SET blocked_by = NULL, blocked_at = NULL
         WHERE a.queue = NEW.queue AND a.ordering_key = NEW.ordering_key AND a.blocked_by = NEW.id;
    END IF;
    -- jobs_flow_reactivate: a keyed job pending again after it finished, waited or was held.
    IF NEW.key IS NOT NULL AND NEW.status = 'pending'
       AND (OLD.finished_at IS NOT NULL OR OLD.status IN ('waiting', 'held')) THEN
        PERFORM leaseq.flow_activate(NEW.queue, NEW.key);
    END IF;
    -- jobs_flow_release: a keyed job leaves running.
    IF OLD.key IS NOT NULL AND OLD.lease_expires_at IS NOT NULL AND NEW.lease_expires_at IS NULL THEN
        -- As flow_on_leave_running was in migration 24.
        DECLARE
            last_one boolean := NEW.status <> 'pending' AND NOT leaseq.flow_key_pending(OLD.queue, OLD.key);
            ran double precision := greatest(extract(epoch FROM coalesce(NEW.finished_at, now()) - OLD.started_at), 0);
            charged boolean := false;
            lim integer;
            freed integer;
        BEGIN
            -- An attempt shorter than 50 ms is charged 50 ms with probability ran / 50 ms: the same
            -- charge in expectation, and a key's row is rewritten by 1 in 50 of its 1 ms jobs, not
            -- by every one (its completions would queue on that row). A lone key is not charged.
            IF ran >= 0.05 OR random() * 0.05 < ran THEN
                UPDATE leaseq.flow_keys f SET vtime = f.vtime + greatest(ran, 0.05) / f.weight
                 WHERE f.queue = OLD.queue AND f.key = OLD.key
                   AND EXISTS (SELECT 1 FROM leaseq.flow_keys o
                                WHERE o.queue = OLD.queue AND o.active AND o.key <> OLD.key)
                RETURNING f.max_running INTO lim;
                charged := FOUND;
            END IF;
            -- The key's row before the slot: the lock order of leaseq.flow_apply (no deadlock with a
            -- limit being changed). Read under the lock, its limit is current: an unlimited key has
            -- no slots, and a limited key's retired slots are those numbered past its limit.
            IF charged THEN
                NULL;
            ELSIF last_one THEN
                SELECT f.max_running INTO lim FROM leaseq.flow_keys f
                 WHERE f.queue = OLD.queue AND f.key = OLD.key FOR UPDATE;
            ELSE
                SELECT f.max_running INTO lim FROM leaseq.flow_keys f
                 WHERE f.queue = OLD.queue AND f.key = OLD.key FOR KEY SHARE;
            END IF;
            IF lim IS NOT NULL THEN
                -- Twice at most: another release of the key may have compacted this unit into a
                -- free slot after the first look's snapshot. The first look waited for that
                -- commit, and the second (a new statement, a new snapshot) sees where it went.
                FOR look IN 1..2 LOOP
                    UPDATE leaseq.flow_slots s SET job_id = NULL, lease_token = NULL, taken_at = NULL
                     WHERE s.job_id = OLD.id AND s.lease_token = OLD.lease_token
                       AND s.queue = OLD.queue AND s.key = OLD.key
                    RETURNING s.slot INTO freed;
                    EXIT WHEN freed IS NOT NULL;
                END LOOP;
                -- A lowered limit still draining: keep its extra units last.
                IF EXISTS (SELECT 1 FROM leaseq.flow_slots s
                            WHERE s.queue = OLD.queue AND s.key = OLD.key AND s.slot > lim) THEN
                    PERFORM leaseq.flow_compact(OLD.queue, OLD.key);
                END IF;
            END IF;
            IF last_one THEN
                UPDATE leaseq.flow_keys f SET active = false
                 WHERE f.queue = OLD.queue AND f.key = OLD.key AND f.active
                   -- A new statement under the key's row lock: an enqueue that committed since
                   -- last_one's snapshot is seen, and so is any job of the key still running.
                   AND NOT leaseq.flow_key_pending(OLD.queue, OLD.key)
                   AND (SELECT j.id FROM leaseq.jobs j
                         WHERE j.status = 'running' AND j.key IS NOT NULL
                           AND j.queue = OLD.queue AND j.key = OLD.key
                         ORDER BY j.id DESC LIMIT 1) IS NULL;
            ELSIF freed IS NOT NULL THEN
                IF NOT EXISTS (SELECT 1 FROM leaseq.flow_slots s
                                WHERE s.queue = OLD.queue AND s.key = OLD.key AND s.job_id IS NULL
                                  AND NOT s.retired AND s.slot <> freed)
                   AND EXISTS (SELECT 1 FROM leaseq.jobs j
                                WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                                  AND j.queue = OLD.queue AND j.key = OLD.key AND j.available_at <= now()) THEN
                    PERFORM pg_notify('leaseq_jobs', OLD.queue);
                END IF;
            END IF;
        END;
    END IF;
    -- jobs_notify_done: a watched job finished.
    IF NEW.notify_done AND NEW.finished_at IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status THEN
        PERFORM pg_notify('leaseq_done', NEW.id::text);
    END IF;
    -- jobs_pipeline_transition: a job of a pipeline, or with children, changed status, and
    -- was or is finished (pipeline_transition did nothing for any other change).
    IF OLD.status IS DISTINCT FROM NEW.status AND (NEW.has_children OR NEW.pipeline_id IS NOT NULL)
       AND (OLD.finished_at IS NOT NULL OR NEW.finished_at IS NOT NULL) THEN
        PERFORM leaseq.pipeline_changed(OLD, NEW);
    END IF;
    RETURN NULL;
END
$fn$;

-- Not on a claim (pending to running): no branch has anything to do there.
CREATE OR REPLACE TRIGGER jobs_on_status AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN ((OLD.status <> 'pending' OR NEW.status <> 'running')
                       AND (OLD.key IS NOT NULL OR NEW.key IS NOT NULL OR OLD.ordering_key IS NOT NULL
                            OR NEW.notify_done OR NEW.has_children OR NEW.pipeline_id IS NOT NULL))
    EXECUTE FUNCTION leaseq.jobs_on_status();
REVOKE ALL ON FUNCTION leaseq.jobs_on_status() FROM PUBLIC;
