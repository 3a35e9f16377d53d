-- leaseq schema: the keyed claim can no longer be planned on an index that holds every
-- unfinished job of a key.
--
-- jobs_key_unfinished_idx (queue, key, id; keyed jobs pending or running) held every row of
-- jobs_key_claim_idx and more, so the keyed claim could be planned on either. With many keys
-- of a few jobs each, the planner estimates one row per key (from the number of distinct
-- keys, which no statistics refresh changes), and then reading the unfinished index and
-- sorting its one row looks cheaper than walking the claim index in claim order (10.3
-- against 12.9 on PostgreSQL 18.6, statistics fresh). A worker's session keeps that generic
-- plan. Once one key has a backlog, every claim of it read and sorted all of that key's
-- unfinished jobs: 50,000 one-job keys, then 20,000 jobs on one key, 20,000 rows, 507
-- buffers and 22 ms per claim, where the claim index reads one row.
--
-- Its place is taken by jobs_key_held_idx, which holds what the claim index does not: a
-- key's running jobs and its pending jobs that wait for their aggregate's turn. The two
-- are disjoint, and a query that asks for claimable jobs (pending, not waiting) does not
-- imply the new index's predicate, so the planner cannot use it for the claim whatever it
-- believes. A key's running jobs (limits applied to a key that runs, status) are one range
-- of it, by status; whether a key has pending work is one probe of each index, read from
-- the end where no finished job's entry is left (the release trigger, once per finished
-- attempt). An enqueue writes one index entry fewer.
--
-- Built with the table locked, as migration 20 rebuilt indexes: it holds running and waiting
-- jobs only.
DROP INDEX leaseq.jobs_key_unfinished_idx;
CREATE INDEX jobs_key_held_idx ON leaseq.jobs (queue, key, status, id)
    WHERE key IS NOT NULL AND (status = 'running' OR (status = 'pending' AND ordering_waiting));

-- As in migration 19; a key's running jobs are read from jobs_key_held_idx.
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

-- Whether a key has a pending job: one claimable (jobs_key_claim_idx, read from its tail:
-- the entries its claimed jobs left behind until vacuum are at its head) or one waiting its
-- aggregate's turn (jobs_key_held_idx, newest first). STABLE: it reads with the snapshot of
-- the statement that calls it.
CREATE FUNCTION leaseq.flow_key_pending(q text, k text)
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

-- As in migration 19, with a key's pending and unfinished jobs found in the two indexes.
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
           -- A new statement under the key's row lock: an enqueue that committed since
           -- last_one's snapshot is seen, and so is any job of the key still running.
           AND NOT leaseq.flow_key_pending(OLD.queue, OLD.key)
           AND (SELECT j.id FROM leaseq.jobs j
                 WHERE j.status = 'running' AND j.key IS NOT NULL
                   AND j.queue = OLD.queue AND j.key = OLD.key
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
