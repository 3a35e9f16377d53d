-- leaseq schema: a limited key's unit is taken and given back without an index write.
--
-- A slot row changes at every keyed claim (job_id, lease_token, taken_at set) and release
-- (cleared). Two partial indexes named job_id (free slots of a key; held slots by job), so
-- neither update could be HOT: each wrote new entries into every index of leaseq.flow_slots
-- and left dead ones for the claim to walk until vacuum. Every statement that reads slots
-- names the key (the primary key's prefix), and a key has at most its limit of slot rows, so
-- the primary key finds them as well; both indexes go, and both updates are HOT (the table
-- keeps fillfactor 50 for the room).
--
-- Measured on PostgreSQL 15 (4 claimers, each claim of one job followed by its completion,
-- 6,000 jobs, limit 4, three rounds in alternating order, nothing else running): 1,000 keys
-- 922 / 702 / 564 jobs/s with the indexes, 1,003 / 850 / 701 without; 1 key 920 / 758 / 963
-- with, 1,093 / 907 / 1,053 without.
--
-- The one reader by job id alone, flow_apply's "has this running job a slot", now names
-- the key too. flow_repair reads every held slot, as before, by a scan of the table.
--
-- A release could leave its unit held (a leak, freed only by the reaper's flow_repair):
-- while a lowered limit drains, a release compacts its key (flow_compact moves the holder
-- of a retired slot into a free one), and releases of one key share their lock on the
-- key's row. A release whose snapshot predates another's compaction found its old slot
-- deleted and could not see the new one. It now looks again, in a new statement, when its
-- first look freed nothing (migration 18's function otherwise unchanged).

DROP INDEX leaseq.flow_slots_free_idx;
DROP INDEX leaseq.flow_slots_held_idx;

-- Brings a key's row and slots in line with its limit (call with the key's row locked or
-- about to be): adds missing slots, un-retires or retires slots past the limit (waiting
-- for claims in flight that hold them), drops slots of a key that became unlimited, and
-- gives a slot to each running job of a key that just became limited.
CREATE OR REPLACE FUNCTION leaseq.flow_apply(q text, k text)
RETURNS void
LANGUAGE plpgsql
-- As in migration 15: it changes flow tables that component roles cannot write.
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
                  WHERE j.status = 'running' AND j.queue = q AND j.key = k
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

CREATE OR REPLACE FUNCTION leaseq.flow_on_leave_running()
RETURNS trigger
LANGUAGE plpgsql
-- As in migration 15: it changes flow tables that component roles cannot write.
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    -- The key's newest unfinished job first: a key with a backlog answers with its first
    -- entry, instead of walking the entries its finished jobs left behind (until vacuum).
    last_one boolean := NEW.status <> 'pending' AND (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.queue = OLD.queue AND j.key = OLD.key AND j.key IS NOT NULL
           AND j.status = 'pending'
         ORDER BY j.id DESC LIMIT 1) IS NULL;
    ran double precision := greatest(extract(epoch FROM coalesce(NEW.finished_at, now()) - OLD.started_at), 0);
    lim integer;
    freed integer;
BEGIN
    -- The key's row before the slot: the lock order of leaseq.flow_apply (no deadlock with a
    -- limit being changed). Read under the lock, its limit is current: an unlimited key has
    -- no slots, and a limited key's retired slots are those numbered past its limit.
    -- An attempt shorter than 50 ms is charged 50 ms with probability ran / 50 ms: the same
    -- charge in expectation, and a key's row is rewritten by 1 in 50 of its 1 ms jobs, not
    -- by every one (its completions would queue on that row).
    IF (ran >= 0.05 OR random() * 0.05 < ran)
       AND EXISTS (SELECT 1 FROM leaseq.flow_keys f
                    WHERE f.queue = OLD.queue AND f.active AND f.key <> OLD.key) THEN
        UPDATE leaseq.flow_keys f SET vtime = f.vtime + greatest(ran, 0.05) / f.weight
         WHERE f.queue = OLD.queue AND f.key = OLD.key
        RETURNING f.max_running INTO lim;
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
           AND (SELECT j.id FROM leaseq.jobs j
                 WHERE j.queue = OLD.queue AND j.key = OLD.key
                   AND j.key IS NOT NULL AND j.status IN ('pending', 'running')
                 ORDER BY j.id DESC LIMIT 1) IS NULL;
    ELSIF freed IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM leaseq.flow_slots s
                           WHERE s.queue = OLD.queue AND s.key = OLD.key AND s.job_id IS NULL
                             AND NOT s.retired AND s.slot <> freed)
          AND EXISTS (SELECT 1 FROM leaseq.jobs j
                       WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                         AND j.queue = OLD.queue AND j.key = OLD.key AND j.available_at <= now()) THEN
        PERFORM pg_notify('leaseq_jobs', OLD.queue);
    END IF;
    RETURN NULL;
END
$fn$;
