-- Pipelines: jobs that wait for jobs.
--
-- A job with unmet parents is `waiting`: outside the claim index (status = 'pending'), so the
-- claim statement and its plan are unchanged. Its edges are rows of leaseq.job_deps (one per
-- parent), and the job keeps deps_left, the number of edges not yet met: the last parent's
-- transition takes it to 0 and the job to pending, in that parent's transaction.
--
-- Why a count on the child and rows per edge, not one or the other:
--  - Rows per edge alone would make "was that the last parent?" a count over the child's
--    edges on every parent completion: O(n) each, O(n^2) for a 10,000-wide fan-in, and two
--    concurrent last parents could each see the other as unmet (READ COMMITTED) and neither
--    would unblock the child.
--  - A count alone cannot answer "who are my parents" (parent_results, jobs show), nor say
--    which descendants a failure cancelled.
--  The count is updated under the child's row lock, so concurrent parent completions are
--  serialized on it and exactly one sees 0 (EvalPlanQual re-reads the row). Only the edge
--  the parent's UPDATE actually transitions is counted (edge.counted), in an AFTER UPDATE
--  trigger guarded by WHEN (status changed AND (has_children OR pipeline_id IS NOT NULL)):
--  a duplicate or stale (fenced) completion changes no row, so it fires nothing, and jobs
--  outside pipelines pay one WHEN test. No advisory locks: the row locks are the ones the
--  transition takes anyway (per-row advisory locks exhausted the lock table on bulk updates).
--
-- Failure: a parent that goes dead or cancelled cancels its waiting children on 'succeeded'
-- edges (recursively, through the same trigger), each with cancelled_by = the job whose
-- failure started the cascade and last_error_code PARENT_FAILED. Retrying that job (dead ->
-- pending) revives exactly the jobs whose cancelled_by names it, back to waiting, and takes
-- back the edges its (and their) finishing had counted for children that have not run.
--
-- The new enum value cannot be used in this migration's transaction (PostgreSQL refuses an
-- uncommitted enum value), so no constraint, index predicate or SQL-function body below
-- names it; plpgsql bodies are only parsed when they run.

ALTER TYPE leaseq.job_status ADD VALUE IF NOT EXISTS 'waiting' BEFORE 'pending';

ALTER TABLE leaseq.jobs
    ADD COLUMN deps_left integer NOT NULL DEFAULT 0 CONSTRAINT jobs_deps_left CHECK (deps_left >= 0),
    ADD COLUMN has_children boolean NOT NULL DEFAULT false,
    ADD COLUMN cancelled_by bigint,
    ADD COLUMN pipeline_id bigint;

-- finished_at is set exactly in the finished states; a waiting job is unfinished too.
ALTER TABLE leaseq.jobs DROP CONSTRAINT jobs_finished_at;
ALTER TABLE leaseq.jobs ADD CONSTRAINT jobs_finished_at CHECK (
    (status IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL)
);

ALTER TABLE leaseq.job_history
    ADD COLUMN deps_left integer NOT NULL DEFAULT 0,
    ADD COLUMN has_children boolean NOT NULL DEFAULT false,
    ADD COLUMN cancelled_by bigint,
    ADD COLUMN pipeline_id bigint;

-- Waiting jobs per queue (metrics) without a scan: deps_left > 0 on an unfinished row is
-- exactly `waiting` (a cascade-cancelled job is finished).
CREATE INDEX jobs_waiting_idx ON leaseq.jobs (queue) WHERE deps_left > 0 AND finished_at IS NULL;
-- What a retry revives.
CREATE INDEX jobs_cancelled_by_idx ON leaseq.jobs (cancelled_by) WHERE cancelled_by IS NOT NULL;
-- A pipeline's jobs (cancel, show).
CREATE INDEX jobs_pipeline_idx ON leaseq.jobs (pipeline_id, id) WHERE pipeline_id IS NOT NULL;

-- One row per edge. No foreign keys: their checks would KEY SHARE-lock job rows, which a
-- claim's FOR UPDATE SKIP LOCKED would then skip.
CREATE TABLE leaseq.job_deps (
    parent_id bigint NOT NULL,
    child_id  bigint NOT NULL,
    -- 'succeeded': the child runs once this parent succeeded, and is cancelled if it goes
    -- dead or cancelled; 'finished': the child runs once this parent finished in any state.
    after     text NOT NULL DEFAULT 'succeeded'
        CONSTRAINT job_deps_after CHECK (after IN ('succeeded', 'finished')),
    -- This edge has been subtracted from the child's deps_left.
    counted   boolean NOT NULL DEFAULT false,
    PRIMARY KEY (parent_id, child_id),
    CONSTRAINT job_deps_not_self CHECK (parent_id <> child_id)
);
CREATE INDEX job_deps_child_idx ON leaseq.job_deps (child_id, parent_id);

-- Progress without scans: kept by the same transactions that finish (or revive) its jobs.
CREATE TABLE leaseq.pipelines (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL CONSTRAINT pipelines_name CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now(),
    total       integer NOT NULL DEFAULT 0,
    succeeded   integer NOT NULL DEFAULT 0,
    dead        integer NOT NULL DEFAULT 0,
    cancelled   integer NOT NULL DEFAULT 0,
    -- Set when every job is finished (succeeded + dead + cancelled = total), cleared by a revival.
    finished_at timestamptz,
    CONSTRAINT pipelines_counts CHECK (
        succeeded >= 0 AND dead >= 0 AND cancelled >= 0 AND succeeded + dead + cancelled <= total)
);
CREATE INDEX pipelines_unfinished_idx ON leaseq.pipelines (id) WHERE finished_at IS NULL;

-- The transition trigger. SECURITY DEFINER: a worker role's completion must unblock and
-- cancel children its row policy does not let it update (they are waiting).
CREATE FUNCTION leaseq.pipeline_transition() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    was_finished boolean := OLD.status::text IN ('succeeded', 'dead', 'cancelled');
    is_finished boolean := NEW.status::text IN ('succeeded', 'dead', 'cancelled');
    at timestamptz := coalesce(NEW.finished_at, now());
    root bigint := coalesce(NEW.cancelled_by, NEW.id);
    woken text;
BEGIN
    IF NEW.pipeline_id IS NOT NULL AND (was_finished OR is_finished) THEN
        UPDATE leaseq.pipelines p
           SET succeeded = p.succeeded + (NEW.status::text = 'succeeded')::int - (OLD.status::text = 'succeeded')::int,
               dead = p.dead + (NEW.status::text = 'dead')::int - (OLD.status::text = 'dead')::int,
               cancelled = p.cancelled + (NEW.status::text = 'cancelled')::int - (OLD.status::text = 'cancelled')::int,
               finished_at = CASE
                   WHEN p.succeeded + p.dead + p.cancelled + is_finished::int - was_finished::int = p.total
                   THEN at END
         WHERE p.id = NEW.pipeline_id;
    END IF;
    IF NOT NEW.has_children THEN
        RETURN NULL;
    END IF;
    IF is_finished AND NOT was_finished THEN
        -- Count the edges this transition meets; the children whose last edge it was become
        -- pending, and their queues are woken in this transaction.
        FOR woken IN
            WITH met AS (
                UPDATE leaseq.job_deps d SET counted = true
                 WHERE d.parent_id = NEW.id AND NOT d.counted
                   AND (NEW.status::text = 'succeeded' OR d.after = 'finished')
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
        IF NEW.status::text IN ('dead', 'cancelled') THEN
            UPDATE leaseq.jobs c
               SET status = 'cancelled', finished_at = at, cancelled_by = root,
                   last_error = format('cancelled: parent job %s is %s', NEW.id, NEW.status)
                                || CASE WHEN root <> NEW.id THEN format(' (after job %s failed)', root) ELSE '' END,
                   last_error_code = 'PARENT_FAILED'
              FROM leaseq.job_deps d
             WHERE d.parent_id = NEW.id AND d.child_id = c.id AND d.after = 'succeeded'
               AND c.status::text = 'waiting';
        END IF;
    ELSIF was_finished AND NOT is_finished THEN
        -- Undo: edges this job's finishing counted, towards children that have not run yet
        -- (waiting, or cancelled by a cascade this revival undoes), count again as unmet.
        WITH un AS (
            UPDATE leaseq.job_deps d SET counted = false
              FROM leaseq.jobs c
             WHERE d.parent_id = NEW.id AND d.counted AND c.id = d.child_id
               AND (c.status::text = 'waiting'
                    OR (c.status::text = 'cancelled' AND c.cancelled_by IS NOT NULL))
            RETURNING d.child_id
        )
        UPDATE leaseq.jobs c SET deps_left = c.deps_left + u.n
          FROM (SELECT child_id, count(*)::int AS n FROM un GROUP BY child_id) u
         WHERE c.id = u.child_id;
        -- Exactly the jobs the cascade started by this job cancelled come back.
        IF NEW.cancelled_by IS NULL THEN
            UPDATE leaseq.jobs c
               SET status = CASE WHEN c.deps_left > 0 THEN 'waiting' ELSE 'pending' END::leaseq.job_status,
                   finished_at = NULL, cancelled_by = NULL,
                   last_error = format('revived: job %s was retried', NEW.id), last_error_code = NULL
             WHERE c.cancelled_by = NEW.id AND c.status::text = 'cancelled';
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;
REVOKE ALL ON FUNCTION leaseq.pipeline_transition() FROM PUBLIC;

CREATE TRIGGER jobs_pipeline_transition
    AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status AND (NEW.has_children OR NEW.pipeline_id IS NOT NULL))
    EXECUTE FUNCTION leaseq.pipeline_transition();

-- Component roles: leaseq.apply_grants() of version 12 does everything version 10 did
-- (which first revokes every table and sequence privilege and drops every leaseq_ policy of
-- the old and given roles), then:
-- worker:   spawns from a handler (inserts jobs, their edges and pipelines in its
--           completion's transaction, takes job ids from the sequence, marks parents), reads
--           parents' results and links.
-- operator: reads edges and pipelines (the mover's and prune's guard, `pipelines show`),
--           deletes the edges of moved and pruned jobs, cancels pipelines.
-- producer: enqueues graphs and jobs after others: inserts jobs with their ids, status and
--           pipeline, their edges and pipelines, and marks its own jobs as parents.
-- The unblocking, cascade and undo run in leaseq.pipeline_transition(), SECURITY DEFINER.
ALTER FUNCTION leaseq.apply_grants(regrole, regrole, regrole) RENAME TO apply_grants_v10;

CREATE FUNCTION leaseq.apply_grants(worker regrole, operator regrole, producer regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    stmt text;
    stmts text[] := ARRAY[]::text[];
    jobs_seq text := pg_get_serial_sequence('leaseq.jobs', 'id');
    pipelines_seq text := pg_get_serial_sequence('leaseq.pipelines', 'id');
    insert_cols text := 'id, queue, job_type, payload, priority, max_attempts, available_at, timeout, idempotency_key, created_at, status, deps_left, has_children, pipeline_id';
BEGIN
    RETURN QUERY SELECT s FROM leaseq.apply_grants_v10(worker, operator, producer) s;
    IF worker IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT, INSERT ON leaseq.job_deps, leaseq.pipelines TO %s', worker),
            format('GRANT UPDATE (total, finished_at) ON leaseq.pipelines TO %s', worker),
            format('GRANT INSERT (%s) ON leaseq.jobs TO %s', insert_cols, worker),
            format('GRANT UPDATE (has_children) ON leaseq.jobs TO %s', worker),
            format('GRANT USAGE ON SEQUENCE %s, %s TO %s', jobs_seq, pipelines_seq, worker),
            -- Only what a fan-out writes: unfinished jobs of a pipeline.
            format('CREATE POLICY leaseq_worker_spawn ON leaseq.jobs FOR INSERT TO %s WITH CHECK (pipeline_id IS NOT NULL AND status::text IN (''waiting'', ''pending''))', worker)];
    END IF;
    IF operator IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT, DELETE ON leaseq.job_deps TO %s', operator),
            format('GRANT SELECT ON leaseq.pipelines TO %s', operator)];
    END IF;
    IF producer IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT, INSERT ON leaseq.job_deps, leaseq.pipelines TO %s', producer),
            format('GRANT UPDATE (total, finished_at) ON leaseq.pipelines TO %s', producer),
            format('GRANT INSERT (%s) ON leaseq.jobs TO %s', insert_cols, producer),
            format('GRANT UPDATE (has_children) ON leaseq.jobs TO %s', producer),
            format('GRANT USAGE ON SEQUENCE %s, %s TO %s', jobs_seq, pipelines_seq, producer),
            format('CREATE POLICY leaseq_producer_parent ON leaseq.jobs FOR UPDATE TO %s USING (enqueued_by = current_user) WITH CHECK (enqueued_by = current_user)', producer),
            -- A producer's jobs start unfinished, whatever columns it may now set.
            format('CREATE POLICY leaseq_producer_unfinished ON leaseq.jobs AS RESTRICTIVE FOR INSERT TO %s WITH CHECK (status::text IN (''waiting'', ''pending''))', producer)];
    END IF;
    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants(regrole, regrole, regrole) FROM PUBLIC;
