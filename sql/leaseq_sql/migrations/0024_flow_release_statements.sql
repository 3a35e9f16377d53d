-- leaseq schema: a keyed job's release runs the statements it needs, not every one it
-- might.
--
-- PL/pgSQL evaluates a condition that holds a subquery as a whole statement (the executor
-- started and ended for it) even when its first operand already decides it. The release
-- of migration 23 ran two such conditions at every finished attempt of a key: the
-- fair-share charge's "another key is active" (behind a sample that is false 49 times in
-- 50 for a 1 ms job) and the wake-up's "the key was saturated and has ready work" (which
-- needs a freed unit, so never holds for an unlimited key).
--
-- * The charge is sampled first; its check for another active key is a condition of the
--   charging UPDATE itself, which takes the key's row lock only when it charges (when it
--   does not, the row is locked by the branch below, as before).
-- * The wake-up's checks run only once a unit was freed.
--
-- Counted with an instruction-counting profiler (one backend, claim and completion of one
-- job of a lone unlimited key at a time, PostgreSQL 18.6): 2,689,000 instructions per job
-- before, 2,655,000 after; a limited key's release is unchanged (3,171,000 and 3,172,000
-- at 1,000 keys with a limit of 4). Everything else, the lock order (the key's row before
-- its slot) and the deactivation under the key's row lock with a new snapshot, is as in
-- migration 23.
CREATE OR REPLACE FUNCTION leaseq.flow_on_leave_running()
RETURNS trigger
LANGUAGE plpgsql
-- As in migration 15: it changes flow tables that component roles cannot write.
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
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
    RETURN NULL;
END
$fn$;
