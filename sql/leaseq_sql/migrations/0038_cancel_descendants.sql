-- leaseq schema: cancelling a job cancels its descendants, and a finished pipeline's console
-- page lists its jobs from history too (docs/guides/pipelines.md, "Cancelling").
--
-- leaseq.cancel_jobs is the one cancel: the jobs named with every unfinished descendant
-- (reached over job_deps, spawned or enqueued after them, transitively), or every unfinished
-- job of a pipeline, in one short transaction (a pass repeats only for jobs a completion
-- committed meanwhile spawned); each cancelled job's last_error says why ("cancelled
-- with ancestor job N", "cancelled with pipeline N by console user X: reason"). job_cancel,
-- pipeline_cancel, console_cancel and console_cancel_pipeline all call it; before, cancelling
-- a pipeline's root left its spawned (pending or running) descendants running.
-- job_history_pipeline_idx lets the console page a finished pipeline's jobs once they moved
-- to history (an index range per leaf, as jobs_pipeline_idx on the hot table).

CREATE INDEX job_history_pipeline_idx ON leaseq.job_history (pipeline_id, id)
    WHERE pipeline_id IS NOT NULL;

CREATE OR REPLACE FUNCTION leaseq.cancel_jobs(job_ids bigint[], pipeline bigint, actor text, reason text, at timestamp with time zone)
 RETURNS TABLE(id bigint, previous_status text, ancestor bigint)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.console_cancel(job_ids bigint[], actor text, reason text, filter jsonb DEFAULT NULL::jsonb)
 RETURNS TABLE(id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    done bigint[];
BEGIN
    IF cardinality(job_ids) > 1000 THEN
        RAISE EXCEPTION 'at most 1000 jobs per console action, % given', cardinality(job_ids)
            USING ERRCODE = '22023';
    END IF;
    SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}') INTO done
      FROM leaseq.cancel_jobs(job_ids, NULL, format('console user %s', actor), reason, now()) c;
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'cancel', done, coalesce(cardinality(job_ids), 0), reason, filter);
    RETURN QUERY SELECT unnest(done);
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.console_cancel_pipeline(pipeline bigint, actor text, reason text)
 RETURNS TABLE(cancelled bigint, running bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    done bigint[];
    n_running bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM leaseq.pipelines p WHERE p.id = pipeline) THEN
        RAISE EXCEPTION 'no pipeline %', pipeline USING ERRCODE = '22023';
    END IF;
    SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}'),
           count(*) FILTER (WHERE c.previous_status = 'running')
      INTO done, n_running
      FROM leaseq.cancel_jobs('{}'::bigint[], pipeline, format('console user %s', actor), reason,
                              now()) c;
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'cancel_pipeline', done, cardinality(done), reason,
            jsonb_build_object('pipeline_id', pipeline));
    RETURN QUERY SELECT cardinality(done)::bigint, n_running;
END
$function$
;
