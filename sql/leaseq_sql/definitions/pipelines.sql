-- leaseq's present tense: pipelines (a job waits for its parents).
--
-- Covers: leaseq.pipeline_count, a pipeline's counts; leaseq.pipeline_changed, called by jobs_on_status (flow.sql) when a job of a
-- pipeline, or with children, changes status and was or is finished; leaseq.cancel_jobs, the
-- one cancel of jobs with their descendants, or of a pipeline. Set off by: every completion,
-- failure, reap and cancel in queries/jobs.sql and queries/pipelines.sql (job_cancel and
-- pipeline_cancel call cancel_as_caller, which calls cancel_jobs or a producer's function),
-- producer_cancel and producer_cancel_pipeline (a producer's own jobs, from any language),
-- console_cancel and console_cancel_pipeline (console.sql); leaseq.pipeline_outcome, one
-- read of a pipeline's outcome for a waiting producer (docs/guides/pipelines.md);
-- leaseq.pipeline_count_cancels, which counts a transaction's cancelled jobs into their
-- pipelines at its commit (set off by pipeline_changed's rows in leaseq.pipeline_uncounted).

-- Adds to a pipeline's counts (each delta -1, 0 or more) and sets its finish time: `at` once
-- every job of it has finished, else none. Tells the producers waiting for it when it
-- finished (NOTIFY leaseq_done 'pipeline:<id>', one per finished pipeline, whoever waits:
-- Queue.wait_pipeline listens on the waiters' channel). A completion that spawns grows the
-- pipeline again later in its transaction: the waiter reads the row and waits on.
CREATE OR REPLACE FUNCTION leaseq.pipeline_count(pipeline bigint, succeeded integer,
                                                 dead integer, cancelled integer,
                                                 at timestamptz)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    done_at timestamptz;
BEGIN
    UPDATE leaseq.pipelines p
       SET succeeded = p.succeeded + pipeline_count.succeeded,
           dead = p.dead + pipeline_count.dead,
           cancelled = p.cancelled + pipeline_count.cancelled,
           finished_at = CASE
               WHEN p.succeeded + p.dead + p.cancelled + pipeline_count.succeeded
                    + pipeline_count.dead + pipeline_count.cancelled = p.total
               THEN at END
     WHERE p.id = pipeline
    RETURNING p.finished_at INTO done_at;
    IF done_at IS NOT NULL THEN
        PERFORM pg_notify('leaseq_done', 'pipeline:' || pipeline);
    END IF;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.pipeline_count(bigint, integer, integer, integer, timestamptz) FROM PUBLIC;

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
BEGIN
    IF new_job.pipeline_id IS NOT NULL AND NOT was_finished AND new_job.status::text = 'cancelled'
       AND new_job.last_error_code IN ('CANCELLED', 'ANCESTOR_CANCELLED', 'PIPELINE_CANCELLED') THEN
        -- One of the jobs a cancel (cancel_jobs) ends, often thousands in one statement: the
        -- pipeline's row is counted once for all of them at commit (pipeline_count_cancels),
        -- not rewritten once per job (each rewrite in one transaction walks every version
        -- the earlier ones left: 16,000 jobs took 2.8 s, 100,000 would take minutes).
        INSERT INTO leaseq.pipeline_uncounted (job_id, pipeline_id, at)
        VALUES (new_job.id, new_job.pipeline_id, at);
    ELSIF new_job.pipeline_id IS NOT NULL AND (was_finished OR is_finished) THEN
        PERFORM leaseq.pipeline_count(
            new_job.pipeline_id,
            (new_job.status::text = 'succeeded')::int - (old_job.status::text = 'succeeded')::int,
            (new_job.status::text = 'dead')::int - (old_job.status::text = 'dead')::int,
            (new_job.status::text = 'cancelled')::int - (old_job.status::text = 'cancelled')::int,
            at);
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
                   -- A child cancelled by request is final (only a cascade's cancel is undone,
                   -- and that one has cancelled_by): its count no longer matters, and a cancel
                   -- of a fan-out would otherwise rewrite its merge once per job it cancels.
                   AND NOT (c.status::text = 'cancelled' AND c.cancelled_by IS NULL)
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

-- Adds the jobs a transaction cancelled (leaseq.pipeline_uncounted, written by
-- pipeline_changed) to their pipelines' counts, once per pipeline, at commit; tells the
-- producers waiting for a pipeline that finished. The first row of the transaction to fire
-- counts them all (a transaction sees only its own uncommitted rows, and every committed one
-- was counted before its commit); each other row finds itself gone by its key. Pipelines are
-- locked in id order.
CREATE OR REPLACE FUNCTION leaseq.pipeline_count_cancels()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    c record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leaseq.pipeline_uncounted u WHERE u.job_id = NEW.job_id) THEN
        RETURN NULL;
    END IF;
    FOR c IN
        WITH gone AS (DELETE FROM leaseq.pipeline_uncounted u RETURNING u.pipeline_id, u.at)
        SELECT g.pipeline_id, count(*)::int AS n, max(g.at) AS at
          FROM gone g GROUP BY g.pipeline_id ORDER BY g.pipeline_id
    LOOP
        PERFORM leaseq.pipeline_count(c.pipeline_id, 0, 0, c.n, c.at);
    END LOOP;
    RETURN NULL;
END
$fn$;

-- SECURITY DEFINER trigger functions are revoked from PUBLIC (see flow.sql's
-- jobs_flow_enqueue). No OR REPLACE for a constraint trigger: it is dropped and made again.
REVOKE ALL ON FUNCTION leaseq.pipeline_count_cancels() FROM PUBLIC;
DROP TRIGGER IF EXISTS pipeline_uncounted_count ON leaseq.pipeline_uncounted;
CREATE CONSTRAINT TRIGGER pipeline_uncounted_count AFTER INSERT ON leaseq.pipeline_uncounted
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION leaseq.pipeline_count_cancels();

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
-- job (row level security, grants) cannot cancel it. Given owned_by, only that login's
-- jobs (enqueued_by) are cancelled, and the walk goes on only through them: a descendant of
-- another owner, and what is reached only through it, is left as it is (a producer's cancel,
-- producer_cancel). Returns each job cancelled, its previous status and the job named whose
-- cancel reached it (NULL for a pipeline's). A reason of more than 2000 characters is
-- refused (invalid_parameter_value, COLUMN reason), whoever cancels: it is written on every
-- job reached.
CREATE OR REPLACE FUNCTION leaseq.cancel_jobs(job_ids bigint[], pipeline bigint, actor text,
                                              reason text, at timestamptz,
                                              owned_by text DEFAULT NULL)
RETURNS TABLE (id bigint, previous_status text, ancestor bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    passes integer := 0;
    found_now bigint;
BEGIN
    IF length(reason) > 2000 THEN
        RAISE EXCEPTION 'invalid reason: is % characters long; the limit is 2000; nothing was cancelled', length(reason)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'reason',
                  DETAIL = format('is %s characters long; the limit is 2000', length(reason));
    END IF;
    LOOP
        passes := passes + 1;
        RETURN QUERY
        WITH RECURSIVE tree (id, root) AS (
            SELECT r, r FROM unnest(job_ids) AS r
            UNION
            SELECT d.child_id, tree.root FROM tree JOIN leaseq.job_deps d ON d.parent_id = tree.id
             WHERE owned_by IS NULL
                OR EXISTS (SELECT 1 FROM leaseq.jobs o WHERE o.id = d.child_id AND o.enqueued_by = owned_by)
        ),
        target AS (
            -- A job under two of the jobs named is cancelled with the first.
            SELECT tree.id, min(tree.root) AS root FROM tree GROUP BY tree.id
            UNION ALL
            SELECT j.id, NULL FROM leaseq.jobs j
             WHERE j.pipeline_id = pipeline AND j.status IN ('waiting', 'pending', 'running', 'held')
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
             WHERE j.status IN ('waiting', 'pending', 'running', 'held')
               AND (owned_by IS NULL OR j.enqueued_by = owned_by)
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

-- Cancels a job (with its descendants) or a pipeline as the caller may: a role that may
-- change a job's status (the owner, the operator's; a worker's is held by its fence) through
-- cancel_jobs with its own rights, any other through the producer's functions below, which
-- reach only the caller's own jobs (the console's role and any other is refused there: it
-- may not execute them). The one cancel of job_cancel and pipeline_cancel (queries), so
-- Queue.cancel and Queue.cancel_pipeline work under every role that may cancel. `at` is used
-- only on the first path (a producer's cancel happens now).
CREATE OR REPLACE FUNCTION leaseq.cancel_as_caller(job_id bigint, pipeline bigint, reason text,
                                                   at timestamptz)
RETURNS TABLE (id bigint, previous_status text, ancestor bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF has_column_privilege('leaseq.jobs', 'status', 'UPDATE') THEN
        RETURN QUERY SELECT c.id, c.previous_status, c.ancestor
                       FROM leaseq.cancel_jobs(CASE WHEN job_id IS NULL THEN '{}'::bigint[] ELSE ARRAY[job_id] END,
                                               pipeline, NULL, reason, at) c;
    ELSIF pipeline IS NOT NULL THEN
        RETURN QUERY SELECT c.id, c.previous_status, c.ancestor
                       FROM leaseq.producer_cancel_pipeline(pipeline, reason) c;
    ELSE
        RETURN QUERY SELECT c.id, c.previous_status, c.ancestor
                       FROM leaseq.producer_cancel(job_id, reason) c;
    END IF;
END
$fn$;

-- A producer cancels its own job, as its login (the role it SET ROLE to, else its session's
-- login: the enqueued_by its jobs are written with): the job if it has not finished, and its
-- unfinished descendants that are its own too (cancel_jobs with owned_by: the walk stops at
-- a job of another owner, which that owner or the operator cancels). A job that is not the
-- caller's cancels nothing and returns nothing, as one that does not exist (worded so it
-- does not tell whether another role's job has this id). SECURITY DEFINER: the producer's
-- role may not change a job's status itself.
CREATE OR REPLACE FUNCTION leaseq.producer_cancel(job_id bigint, reason text DEFAULT NULL)
RETURNS TABLE (id bigint, previous_status text, ancestor bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    caller text := coalesce(nullif(current_setting('role'), 'none'), session_user);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = producer_cancel.job_id AND j.enqueued_by = caller) THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT c.id, c.previous_status, c.ancestor
                   FROM leaseq.cancel_jobs(ARRAY[producer_cancel.job_id], NULL, NULL, reason, now(), caller) c;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.producer_cancel(bigint, text) FROM PUBLIC;

-- A producer cancels its own pipeline (created_by its login, as producer_cancel reads it:
-- a graph it enqueued, or a fan-out of its jobs): every unfinished job of it that is its own
-- ("cancelled with pipeline N: <reason>"). A pipeline that is not the caller's cancels
-- nothing and returns nothing. SECURITY DEFINER.
CREATE OR REPLACE FUNCTION leaseq.producer_cancel_pipeline(pipeline_id bigint, reason text DEFAULT NULL)
RETURNS TABLE (id bigint, previous_status text, ancestor bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    caller text := coalesce(nullif(current_setting('role'), 'none'), session_user);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leaseq.pipelines p WHERE p.id = producer_cancel_pipeline.pipeline_id AND p.created_by = caller) THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT c.id, c.previous_status, c.ancestor
                   FROM leaseq.cancel_jobs('{}'::bigint[], producer_cancel_pipeline.pipeline_id, NULL, reason, now(), caller) c;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.producer_cancel_pipeline(bigint, text) FROM PUBLIC;

-- One read of a pipeline's outcome, for a producer waiting for it from any language: its
-- state (running until every job finished, then succeeded, failed when a job is dead, or
-- cancelled), counters and finish time, how many sinks it has (its jobs no other job waits
-- for, once finished; counted up to 1000: 1000 means 1000 or more) and, when it has exactly
-- one, that sink's id, status, result and last error. No row for a pipeline the caller
-- cannot see: it runs with the caller's rights (row level security shows a producer only
-- its own pipelines and jobs). Wait with it: LISTEN leaseq_done, call it, and while state is
-- running wait for the notification 'pipeline:<id>' (sent by the transaction that finishes
-- the pipeline), then call it again (docs/guides/pipelines.md).
CREATE OR REPLACE FUNCTION leaseq.pipeline_outcome(pipeline_id bigint)
RETURNS TABLE (state text, total integer, succeeded integer, dead integer, cancelled integer,
               finished_at timestamptz, sinks integer, sink_id bigint, sink_status text,
               result jsonb, last_error text)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT CASE WHEN p.finished_at IS NULL THEN 'running'
                WHEN p.dead > 0 THEN 'failed'
                WHEN p.cancelled > 0 THEN 'cancelled'
                ELSE 'succeeded' END,
           p.total, p.succeeded, p.dead, p.cancelled, p.finished_at,
           CASE WHEN p.finished_at IS NOT NULL THEN s.n::integer END,
           one.id, one.status::text, one.result, one.last_error
      FROM leaseq.pipelines p
     -- Sinks are read only once the pipeline has finished: a wake-up before is one
     -- primary-key lookup.
     CROSS JOIN LATERAL (
           SELECT count(*) AS n FROM (SELECT 1 FROM leaseq.jobs j
                                       WHERE p.finished_at IS NOT NULL AND j.pipeline_id = p.id
                                         AND NOT j.has_children
                                       LIMIT 1000) k) s
      LEFT JOIN LATERAL (
           SELECT j.id, j.status, j.result, j.last_error FROM leaseq.jobs j
            WHERE j.pipeline_id = p.id AND NOT j.has_children
            ORDER BY j.id DESC LIMIT 1) one
        ON s.n = 1
     WHERE p.id = pipeline_outcome.pipeline_id
$fn$;
