-- leaseq's present tense: pipelines (a job waits for its parents).
--
-- Covers: leaseq.pipeline_changed, called by jobs_on_status (flow.sql) when a job of a
-- pipeline, or with children, changes status and was or is finished; leaseq.cancel_jobs, the
-- one cancel of jobs with their descendants, or of a pipeline. Set off by: every completion,
-- failure, reap and cancel in queries/jobs.sql and queries/pipelines.sql (job_cancel and
-- pipeline_cancel call cancel_jobs), and console_cancel and console_cancel_pipeline
-- (console.sql).

-- What a pipeline does when one of its jobs, or a job with children, changes status and was
-- or is finished: counts it, tells the producers waiting for the pipeline when it finished
-- (NOTIFY leaseq_done 'pipeline:<id>': a hint to read the row again), unblocks children,
-- cascades a failure as cancellations, undoes them on a retry. Called by jobs_on_status.
CREATE OR REPLACE FUNCTION leaseq.pipeline_changed(old_job leaseq.jobs, new_job leaseq.jobs)
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
    done_at timestamptz;
BEGIN
    IF new_job.pipeline_id IS NOT NULL AND (was_finished OR is_finished) THEN
        UPDATE leaseq.pipelines p
           SET succeeded = p.succeeded + (new_job.status::text = 'succeeded')::int - (old_job.status::text = 'succeeded')::int,
               dead = p.dead + (new_job.status::text = 'dead')::int - (old_job.status::text = 'dead')::int,
               cancelled = p.cancelled + (new_job.status::text = 'cancelled')::int - (old_job.status::text = 'cancelled')::int,
               finished_at = CASE
                   WHEN p.succeeded + p.dead + p.cancelled + is_finished::int - was_finished::int = p.total
                   THEN at END
         WHERE p.id = new_job.pipeline_id
        RETURNING p.finished_at INTO done_at;
        IF done_at IS NOT NULL THEN
            -- One per finished pipeline, whoever waits (Queue.wait_pipeline listens on the
            -- waiters' channel). A completion that spawns grows the pipeline again later in
            -- its transaction: the waiter reads the row and waits on.
            PERFORM pg_notify('leaseq_done', 'pipeline:' || new_job.pipeline_id);
        END IF;
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

REVOKE ALL ON FUNCTION leaseq.pipeline_changed(leaseq.jobs, leaseq.jobs) FROM PUBLIC;

-- Cancels, in one short transaction, the unfinished jobs named in job_ids with every
-- unfinished descendant of theirs (the jobs reached over job_deps edges from them,
-- transitively: spawned by them or enqueued after them), or, given a pipeline, every
-- unfinished job of it. Waiting and pending jobs (a sleeping one is pending) never run; a
-- running one's lease ends, so its worker's next heartbeat, step or completion is refused,
-- and its attempt is recorded as cancelled. Each job's last_error (and a running one's
-- attempt) says why: "cancelled with ancestor job N" for a descendant, "cancelled with
-- pipeline N" for a pipeline's, "cancelled" for a job named, each with " by <actor>" and
-- ": <reason>" when given (a job named without an actor: the reason alone). cancelled_by
-- stays NULL: a retry of an ancestor does not undo a cancel someone asked for. Each pass
-- walks the edges visiting each job once (UNION, through job_deps_pkey) and locks the rows
-- in id order; a completion that committed while a pass waited for its row lock may have
-- spawned jobs that pass could not see, so a second pass runs (a new snapshot), and a third
-- if the second found any. It runs with its caller's rights: who may not update a
-- job (row level security, grants) cannot cancel it. Returns each job cancelled, its
-- previous status and the job named whose cancel reached it (NULL for a pipeline's).
CREATE OR REPLACE FUNCTION leaseq.cancel_jobs(job_ids bigint[], pipeline bigint, actor text,
                                              reason text, at timestamptz)
RETURNS TABLE (id bigint, previous_status text, ancestor bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    passes integer := 0;
    found_now bigint;
BEGIN
    LOOP
        passes := passes + 1;
        RETURN QUERY
        WITH RECURSIVE tree (id, root) AS (
            SELECT r, r FROM unnest(job_ids) AS r
            UNION
            SELECT d.child_id, tree.root FROM tree JOIN leaseq.job_deps d ON d.parent_id = tree.id
        ),
        target AS (
            -- A job under two of the jobs named is cancelled with the first.
            SELECT tree.id, min(tree.root) AS root FROM tree GROUP BY tree.id
            UNION ALL
            SELECT j.id, NULL FROM leaseq.jobs j
             WHERE j.pipeline_id = pipeline AND j.status IN ('waiting', 'pending', 'running')
        ),
        cur AS (
            SELECT j.id, j.status, j.lease_owner, j.lease_token, j.attempt_count, j.started_at,
                   target.root,
                   CASE WHEN target.root = j.id AND actor IS NULL THEN coalesce(reason, 'cancelled')
                        ELSE CASE WHEN target.root IS NULL THEN format('cancelled with pipeline %s', pipeline)
                                  WHEN target.root = j.id THEN 'cancelled'
                                  ELSE format('cancelled with ancestor job %s', target.root) END
                             || coalesce(' by ' || actor, '') || coalesce(': ' || reason, '') END AS why,
                   CASE WHEN target.root IS NULL THEN 'PIPELINE_CANCELLED'
                        WHEN target.root = j.id THEN 'CANCELLED'
                        ELSE 'ANCESTOR_CANCELLED' END AS code
              FROM leaseq.jobs j JOIN target ON target.id = j.id
             WHERE j.status IN ('waiting', 'pending', 'running')
             ORDER BY j.id
               FOR UPDATE OF j
        ),
        cancelled AS (
            UPDATE leaseq.jobs j
               SET status = 'cancelled', finished_at = at, lease_expires_at = NULL,
                   last_error = cur.why, last_error_code = cur.code
              FROM cur
             WHERE j.id = cur.id
            RETURNING j.id
        ),
        attempt AS (
            INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at,
                                             outcome, error)
            SELECT cur.id, cur.attempt_count, cur.lease_token, cur.lease_owner, cur.started_at, at,
                   'cancelled', cur.why
              FROM cur JOIN cancelled USING (id)
             WHERE cur.status = 'running'
            -- An attempt a refused call already ended on an expired lease stays fenced.
            ON CONFLICT (job_id, lease_token) DO NOTHING
        )
        SELECT cur.id, cur.status::text, cur.root FROM cur JOIN cancelled USING (id) ORDER BY cur.id;
        GET DIAGNOSTICS found_now = ROW_COUNT;
        -- The first pass may find nothing only because a completion ended the job it waited
        -- for: the second always runs.
        EXIT WHEN (found_now = 0 AND passes >= 2) OR passes = 3;
    END LOOP;
END
$fn$;
