-- leaseq schema: a cancel's reason is bounded whoever cancels.
-- producer_cancel and producer_cancel_pipeline each refused a reason over 2000 characters
-- (it is written on every job a cancel reaches), with the same five lines; the operator's
-- and the console's cancels wrote any length. The check is now cancel_jobs', the one cancel
-- all of them run, and the producers' functions no longer repeat it.

CREATE OR REPLACE FUNCTION leaseq.cancel_jobs(job_ids bigint[], pipeline bigint, actor text, reason text, at timestamp with time zone, owned_by text DEFAULT NULL::text)
 RETURNS TABLE(id bigint, previous_status text, ancestor bigint)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.producer_cancel(job_id bigint, reason text DEFAULT NULL::text)
 RETURNS TABLE(id bigint, previous_status text, ancestor bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;

CREATE OR REPLACE FUNCTION leaseq.producer_cancel_pipeline(pipeline_id bigint, reason text DEFAULT NULL::text)
 RETURNS TABLE(id bigint, previous_status text, ancestor bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;
