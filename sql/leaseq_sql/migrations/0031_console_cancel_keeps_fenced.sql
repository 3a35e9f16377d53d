-- leaseq schema: the console's cancels keep an attempt a refused call already ended.
--
-- A worker call refused on an expired lease that no reaper had taken yet records the attempt
-- as fenced under the job's current token (job_record_fenced). Cancelling that job then
-- inserted a second attempt row for the same token and failed on job_attempts' primary key,
-- for as long as no reaper ran. The named statements job_cancel and pipeline_cancel keep the
-- fenced row (ON CONFLICT DO NOTHING, as job_reap does); so do the console's two functions
-- now (console.sql); CREATE OR REPLACE keeps their grants.

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
    WITH cur AS (
        SELECT j.id, j.status, j.lease_owner, j.lease_token, j.attempt_count, j.started_at
          FROM leaseq.jobs j
         WHERE j.id = ANY(job_ids) AND j.status IN ('waiting', 'pending', 'running')
           FOR UPDATE
    ),
    cancelled AS (
        UPDATE leaseq.jobs j
           SET status = 'cancelled', finished_at = now(), lease_expires_at = NULL,
               last_error = reason
          FROM cur
         WHERE j.id = cur.id
        RETURNING j.id
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT cur.id, cur.attempt_count, cur.lease_token, cur.lease_owner, cur.started_at, now(), 'cancelled', reason
          FROM cur JOIN cancelled USING (id)
         WHERE cur.status = 'running'
        ON CONFLICT (job_id, lease_token) DO NOTHING
    )
    SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}') INTO done FROM cancelled c;
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
    WITH t AS (SELECT now() AS now),
    cur AS (
        SELECT j.id, j.status, j.lease_owner, j.lease_token, j.attempt_count, j.started_at
          FROM leaseq.jobs j
         WHERE j.pipeline_id = pipeline AND j.status IN ('waiting', 'pending', 'running')
         ORDER BY j.id
           FOR UPDATE
    ),
    c AS (
        UPDATE leaseq.jobs j
           SET status = 'cancelled', finished_at = t.now, lease_expires_at = NULL,
               last_error = coalesce(reason, 'pipeline cancelled'), last_error_code = 'PIPELINE_CANCELLED'
          FROM cur, t
         WHERE j.id = cur.id
        RETURNING j.id
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT cur.id, cur.attempt_count, cur.lease_token, cur.lease_owner, cur.started_at, t.now,
               'cancelled', coalesce(reason, 'pipeline cancelled')
          FROM cur JOIN c USING (id), t
         WHERE cur.status = 'running'
        ON CONFLICT (job_id, lease_token) DO NOTHING
    )
    SELECT coalesce(array_agg(cur.id ORDER BY cur.id), '{}'),
           count(*) FILTER (WHERE cur.status = 'running')
      INTO done, n_running
      FROM cur JOIN c USING (id);
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'cancel_pipeline', done, cardinality(done), reason,
            jsonb_build_object('pipeline_id', pipeline));
    RETURN QUERY SELECT cardinality(done)::bigint, n_running;
END
$function$
;
