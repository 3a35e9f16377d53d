-- leaseq schema: one trigger on a job's change of status where there were six.
--
-- Every statement that sets a job's status (each claim and each completion) rebuilt the
-- WHEN clause of all six status triggers, and queued the row's event for each whose clause
-- held: after migration 25, with their clauses as small as NULL tests, they still cost
-- 310,000 of the 1,785,000 instructions a keyless job takes (claim and completion, counted
-- with an instruction-counting profiler, one backend, PostgreSQL 18.6), none of them
-- firing. Now one trigger, jobs_on_status, has one clause (the job has a key, an ordering
-- key, a watcher, children or a pipeline: what each of the six needed), and its function
-- runs each former trigger's work under that trigger's own condition, in the order they
-- fired (by name): the head of an aggregate finished, a dead head revived, a keyed job
-- pending again, a keyed job leaving running, a watched job finished, a pipeline's job
-- changed. A keyed job's release is written out in it, as it was in its own function; the
-- pipelines' work moved, unchanged, into a function of the row before and after
-- (pipeline_changed); flow_activate is the enqueue's key activation, which a keyed job
-- pending again shares.
--
-- Counted the same way after this migration: 1,561,000 instructions per keyless job; a
-- keyed job of a lone unlimited key 1,899,000 (2,049,000 before), of 1,000 keys with a
-- limit of 4 each 2,619,000 (2,770,000 before).

CREATE FUNCTION leaseq.flow_activate(q text, k text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    floor_vtime double precision;
    inserted boolean;
BEGIN
    SELECT min(f.vtime) INTO floor_vtime FROM leaseq.flow_keys f
     WHERE f.queue = q AND f.active;
    INSERT INTO leaseq.flow_keys AS f (queue, key, vtime, active)
    VALUES (q, k, coalesce(floor_vtime, 0), true)
    ON CONFLICT (queue, key) DO UPDATE
       SET active = true, vtime = greatest(f.vtime, coalesce(floor_vtime, f.vtime))
     WHERE NOT f.active
    RETURNING (f.xmax = 0) INTO inserted;
    IF inserted THEN
        PERFORM leaseq.flow_apply(q, k);
    END IF;
END
$fn$;

-- As pipeline_transition was in migration 12.
CREATE FUNCTION leaseq.pipeline_changed(old_job leaseq.jobs, new_job leaseq.jobs)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    was_finished boolean := old_job.status::text IN ('succeeded', 'dead', 'cancelled');
    is_finished boolean := new_job.status::text IN ('succeeded', 'dead', 'cancelled');
    at timestamptz := coalesce(new_job.finished_at, now());
    root bigint := coalesce(new_job.cancelled_by, new_job.id);
    woken text;
BEGIN
    IF new_job.pipeline_id IS NOT NULL AND (was_finished OR is_finished) THEN
        UPDATE leaseq.pipelines p
           SET succeeded = p.succeeded + (new_job.status::text = 'succeeded')::int - (old_job.status::text = 'succeeded')::int,
               dead = p.dead + (new_job.status::text = 'dead')::int - (old_job.status::text = 'dead')::int,
               cancelled = p.cancelled + (new_job.status::text = 'cancelled')::int - (old_job.status::text = 'cancelled')::int,
               finished_at = CASE
                   WHEN p.succeeded + p.dead + p.cancelled + is_finished::int - was_finished::int = p.total
                   THEN at END
         WHERE p.id = new_job.pipeline_id;
    END IF;
    IF NOT new_job.has_children THEN
        RETURN;
    END IF;
    IF is_finished AND NOT was_finished THEN
        -- Count the edges this transition meets; the children whose last edge it was become
        -- pending, and their queues are woken in this transaction.
        FOR woken IN
            WITH met AS (
                UPDATE leaseq.job_deps d SET counted = true
                 WHERE d.parent_id = new_job.id AND NOT d.counted
                   AND (new_job.status::text = 'succeeded' OR d.after = 'finished')
                RETURNING d.child_id
            ),
            ready AS (
                UPDATE leaseq.jobs c
                   SET deps_left = c.deps_left - m.n,
                       status = CASE WHEN c.status::text = 'waiting' AND c.deps_left = m.n
                                     THEN 'pending' ELSE c.status::text END::leaseq.job_status
                  FROM (SELECT child_id, count(*)::int AS n FROM met GROUP BY child_id) m
                 WHERE c.id = m.child_id
                RETURNING c.queue, c.status, c.deps_left
            )
            SELECT DISTINCT ready.queue FROM ready
             WHERE ready.status::text = 'pending' AND ready.deps_left = 0
        LOOP
            PERFORM pg_notify('leaseq_jobs', woken);
        END LOOP;
        IF new_job.status::text IN ('dead', 'cancelled') THEN
            UPDATE leaseq.jobs c
               SET status = 'cancelled', finished_at = at, cancelled_by = root,
                   last_error = format('cancelled: parent job %s is %s', new_job.id, new_job.status)
                                || CASE WHEN root <> new_job.id THEN format(' (after job %s failed)', root) ELSE '' END,
                   last_error_code = 'PARENT_FAILED'
              FROM leaseq.job_deps d
             WHERE d.parent_id = new_job.id AND d.child_id = c.id AND d.after = 'succeeded'
               AND c.status::text = 'waiting';
        END IF;
    ELSIF was_finished AND NOT is_finished THEN
        -- Undo: edges this job's finishing counted, towards children that have not run yet
        -- (waiting, or cancelled by a cascade this revival undoes), count again as unmet.
        WITH un AS (
            UPDATE leaseq.job_deps d SET counted = false
              FROM leaseq.jobs c
             WHERE d.parent_id = new_job.id AND d.counted AND c.id = d.child_id
               AND (c.status::text = 'waiting'
                    OR (c.status::text = 'cancelled' AND c.cancelled_by IS NOT NULL))
            RETURNING d.child_id
        )
        UPDATE leaseq.jobs c SET deps_left = c.deps_left + u.n
          FROM (SELECT child_id, count(*)::int AS n FROM un GROUP BY child_id) u
         WHERE c.id = u.child_id;
        -- Exactly the jobs the cascade started by this job cancelled come back.
        IF new_job.cancelled_by IS NULL THEN
            UPDATE leaseq.jobs c
               SET status = CASE WHEN c.deps_left > 0 THEN 'waiting' ELSE 'pending' END::leaseq.job_status,
                   finished_at = NULL, cancelled_by = NULL,
                   last_error = format('revived: job %s was retried', new_job.id), last_error_code = NULL
             WHERE c.cancelled_by = new_job.id AND c.status::text = 'cancelled';
        END IF;
    END IF;
    RETURN;
END
$fn$;

-- The two run as the owner of what calls them, the triggers below; nobody else calls them.
REVOKE ALL ON FUNCTION leaseq.flow_activate(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION leaseq.pipeline_changed(leaseq.jobs, leaseq.jobs) FROM PUBLIC;

-- AFTER INSERT of a keyed job, as in migration 25 (its UPDATE case is jobs_on_status's now).
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

CREATE FUNCTION leaseq.jobs_on_status()
RETURNS trigger
LANGUAGE plpgsql
-- As the six triggers' functions mostly were: it changes tables component roles cannot write.
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
    -- jobs_flow_reactivate: a keyed job pending again after it finished or waited.
    IF NEW.key IS NOT NULL AND NEW.status = 'pending'
       AND (OLD.finished_at IS NOT NULL OR OLD.status = 'waiting') THEN
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

DROP TRIGGER jobs_flow_head_done ON leaseq.jobs;
DROP TRIGGER jobs_flow_head_revived ON leaseq.jobs;
DROP TRIGGER jobs_flow_reactivate ON leaseq.jobs;
DROP TRIGGER jobs_flow_release ON leaseq.jobs;
DROP TRIGGER jobs_notify_done ON leaseq.jobs;
DROP TRIGGER jobs_pipeline_transition ON leaseq.jobs;
DROP FUNCTION leaseq.flow_on_head_done();
DROP FUNCTION leaseq.flow_on_head_revived();
DROP FUNCTION leaseq.flow_on_leave_running();
DROP FUNCTION leaseq.notify_done();
DROP FUNCTION leaseq.pipeline_transition();

CREATE TRIGGER jobs_on_status AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN (OLD.key IS NOT NULL OR NEW.key IS NOT NULL OR OLD.ordering_key IS NOT NULL
                       OR NEW.notify_done OR NEW.has_children OR NEW.pipeline_id IS NOT NULL)
    EXECUTE FUNCTION leaseq.jobs_on_status();
