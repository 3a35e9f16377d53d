-- leaseq schema: one definition of how a pipeline's counts change.
-- pipeline_changed (a job's transition) and pipeline_count_cancels (a cancel's jobs at
-- commit) each wrote the pipeline's counter update, finish time and NOTIFY; both now call
-- leaseq.pipeline_count. No behaviour changes.

CREATE OR REPLACE FUNCTION leaseq.pipeline_changed(old_job leaseq.jobs, new_job leaseq.jobs)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.pipeline_count(pipeline bigint, succeeded integer, dead integer, cancelled integer, at timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;
REVOKE ALL ON FUNCTION leaseq.pipeline_count(bigint,integer,integer,integer,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.pipeline_count_cancels()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;
