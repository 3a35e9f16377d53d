-- leaseq schema: the web console shows pipelines (docs/guides/console.md, "Pipelines").
--
-- The console role may read leaseq.pipelines and leaseq.job_deps (no row policies: neither
-- table has row level security) and, only with admin = true, EXECUTE
-- leaseq.console_cancel_pipeline(), which cancels exactly what `leaseq pipelines cancel`
-- cancels (statement pipeline_cancel in sql/queries/pipelines.sql: every waiting, pending or
-- running job of the pipeline, a running holder fenced and its attempt recorded cancelled)
-- and writes its leaseq.console_audit row in the same transaction.
-- leaseq.console_cancel() takes waiting jobs too (as `leaseq cancel` does).
-- apply_console_grants() of version 13 is wrapped the way 0010 wraps apply_grants().

-- A pipeline's unfinished jobs, in id order: the pipeline page's list is one range of this
-- index, however many of the pipeline's jobs have finished (without it, a page of a mostly
-- finished pipeline fetched every finished job's row to skip it: 20,000 buffers for a window
-- of 5,000 at 2,000,000 jobs). Only pipeline jobs are in it, and only until they finish; a job
-- outside pipelines pays the predicate's test. The build reads leaseq.jobs once under a
-- lock that holds writes (as 0013's did).
CREATE INDEX jobs_pipeline_unfinished_idx ON leaseq.jobs (pipeline_id, id)
    WHERE pipeline_id IS NOT NULL AND finished_at IS NULL;

ALTER TABLE leaseq.console_audit DROP CONSTRAINT console_audit_action;
ALTER TABLE leaseq.console_audit ADD CONSTRAINT console_audit_action
    CHECK (action IN ('retry_dead', 'cancel', 'cancel_pipeline'));

-- Cancels every unfinished job of a pipeline, as pipeline_cancel does (same rows, same
-- columns set, same attempt rows), with one audit row naming the jobs cancelled (filter:
-- {"pipeline_id": id}). No cap on the number of jobs: `leaseq pipelines cancel` has none,
-- and a partial cancel would leave a pipeline half running. Returns how many jobs were
-- cancelled and how many of them were running.
CREATE FUNCTION leaseq.console_cancel_pipeline(pipeline bigint, actor text, reason text)
RETURNS TABLE (cancelled bigint, running bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
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
$fn$;

REVOKE ALL ON FUNCTION leaseq.console_cancel_pipeline(bigint, text, text) FROM PUBLIC;

-- A job's cancel through the console takes a waiting job too, as `leaseq cancel` does (its
-- waiting descendants follow, by the pipelines trigger, with cancelled_by naming it). The rest
-- is 0013's function unchanged; CREATE OR REPLACE keeps its grants.
CREATE OR REPLACE FUNCTION leaseq.console_cancel(job_ids bigint[], actor text, reason text, filter jsonb DEFAULT NULL)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
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
    )
    SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}') INTO done FROM cancelled c;
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'cancel', done, coalesce(cardinality(job_ids), 0), reason, filter);
    RETURN QUERY SELECT unnest(done);
END
$fn$;

ALTER FUNCTION leaseq.apply_console_grants(regrole, boolean) RENAME TO apply_console_grants_v13;

-- Version 13 (revoke everything from the previous console roles and the given one, grant
-- read access and, with admin, its two functions), then: SELECT on the pipelines tables and,
-- with admin, EXECUTE on console_cancel_pipeline. That function's EXECUTE is revoked first
-- from the previous console roles and the given one (version 13 knows only its own two).
CREATE FUNCTION leaseq.apply_console_grants(console regrole, admin boolean)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r regrole;
    stmt text;
    before text[] := ARRAY[]::text[];
    stmts text[] := ARRAY[]::text[];
BEGIN
    -- Before version 13 runs: it checks the caller and the role, and forgets the old roles.
    IF pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'leaseq.jobs'::regclass), 'USAGE') THEN
        FOR r IN
            SELECT DISTINCT x FROM (
                SELECT c.role_oid::regrole AS x FROM leaseq.console_roles c
                 WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid)
                UNION ALL SELECT console WHERE console IS NOT NULL
            ) s
        LOOP
            before := before || format('REVOKE ALL ON FUNCTION leaseq.console_cancel_pipeline(bigint, text, text) FROM %s', r);
        END LOOP;
    END IF;
    RETURN QUERY SELECT s FROM leaseq.apply_console_grants_v13(console, admin) s;
    IF console IS NOT NULL THEN
        stmts := stmts || format('GRANT SELECT ON leaseq.pipelines, leaseq.job_deps TO %s', console);
        IF admin THEN
            stmts := stmts || format('GRANT EXECUTE ON FUNCTION leaseq.console_cancel_pipeline(bigint, text, text) TO %s', console);
        END IF;
    END IF;
    FOREACH stmt IN ARRAY before || stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_console_grants(regrole, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION leaseq.apply_console_grants_v13(regrole, boolean) FROM PUBLIC;
