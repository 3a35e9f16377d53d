-- leaseq schema: a cheaper release of a keyed job's unit, and a retried keyed job that is
-- claimable again.
--
-- The release (flow_on_leave_running, migration 15) sent a NOTIFY for every keyed attempt that
-- left `running`, and rewrote its key's row every time. A NOTIFY takes a database-wide lock
-- at commit, held through the commit's WAL flush, so every keyed completion committed alone
-- (no group commit); and one hot key's completions queued on its row. Now:
--   * it wakes claimers only when the unit it gives back can start a job nobody could start
--     before: its key is limited, has a ready job, and had no other free unit (a key with a
--     free unit was claimable already; workers do not wait on it);
--   * it charges the attempt's run seconds to the key's virtual time only while another key
--     of the queue is active. Fair shares are between keys that compete: a lone key's
--     virtual time stands still, and a key that arrives starts level with it (the floor is the
--     smallest active virtual time), as before. An attempt shorter than 50 ms is charged
--     50 ms with probability run time / 50 ms (unbiased), so short jobs rarely rewrite the
--     row;
--   * otherwise it only share-locks the key's row (FOR KEY SHARE: releases of one key no
--     longer wait for each other), which still orders it after a limit being changed
--     (flow_apply locks the row FOR UPDATE): a retired unit or a running job given a unit
--     by a new limit is seen by the release, never missed. The limit it reads there tells it
--     whether there is a slot to give back at all (an unlimited key has none) and where the
--     retired ones are (past the limit: one index probe, not a walk over every slot);
--   * a release that may be its key's last (no pending job of the key) locks the row FOR
--     UPDATE first, then looks for unfinished jobs in a later statement (a fresh snapshot):
--     an enqueue of the key that holds the row is waited for and seen, so a key with work is
--     never left inactive. That lock is chosen before any other is taken: nothing upgrades a
--     lock, so two releases cannot deadlock on the row.
--
-- Whether the release is its key's last read the key's unfinished jobs from the oldest: at
-- 10,000 jobs of one key, every release walked the index entries left by the jobs that had
-- finished since the last vacuum. It reads the newest first now.
--
-- A keyed job put back to pending from a final state (a dead job retried) made its key
-- active only if another job of the key was unfinished: its key had gone inactive when it
-- died, and the keyed claim walks active keys only, so it was never claimed again. Now any
-- keyed job that returns to pending from outside `running` makes its key active, as an
-- enqueue does.

-- Unfinished keyed jobs by id: "has the key a pending job" is read newest first (see
-- below). Equality lookups on (queue, key) use it as before.
DROP INDEX leaseq.jobs_key_unfinished_idx;
CREATE INDEX jobs_key_unfinished_idx ON leaseq.jobs (queue, key, id)
    WHERE key IS NOT NULL AND status IN ('pending', 'running');

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
        UPDATE leaseq.flow_slots s SET job_id = NULL, lease_token = NULL, taken_at = NULL
         WHERE s.job_id = OLD.id AND s.lease_token = OLD.lease_token
           AND s.queue = OLD.queue AND s.key = OLD.key
        RETURNING s.slot INTO freed;
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

CREATE TRIGGER jobs_flow_reactivate AFTER UPDATE ON leaseq.jobs
    FOR EACH ROW WHEN (NEW.key IS NOT NULL AND NEW.status = 'pending'
                       AND OLD.status NOT IN ('pending', 'running'))
    EXECUTE FUNCTION leaseq.flow_on_enqueue();
