-- leaseq schema: the web console (`leaseq console`, docs/guides/console.md).
--
-- The console connects as its own database role. What that role may do is decided here, not
-- by the web application: leaseq.apply_console_grants() gives it read access to what the pages
-- show and, only with admin = true, EXECUTE on the two admin functions below. Each of them
-- changes jobs and writes its leaseq.console_audit row in the same statement's transaction,
-- so no retry or cancel through the console goes unrecorded. A read-only console is a role
-- granted with admin = false: the database refuses its admin actions (42501).
--
-- The console's policies are named lqconsole_*, not leaseq_*: leaseq.apply_grants() drops
-- every leaseq_* policy when it re-grants the components, and must not drop these.

-- Who retried or cancelled what through the console, when and why.
CREATE TABLE leaseq.console_audit (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    -- The database role the console logged in as (session_user: the functions run as their
    -- owner, so current_user would name the owner).
    db_role text NOT NULL DEFAULT session_user,
    -- The person, as the console authenticated them (basic auth user, proxy header, "local").
    actor   text NOT NULL CONSTRAINT console_audit_actor CHECK (length(actor) BETWEEN 1 AND 200),
    action  text NOT NULL CONSTRAINT console_audit_action CHECK (action IN ('retry_dead', 'cancel')),
    -- The jobs the action changed (those that were no longer dead/unfinished are left out).
    job_ids bigint[] NOT NULL,
    -- How many the action was asked to change.
    asked   integer NOT NULL,
    reason  text NOT NULL CONSTRAINT console_audit_reason CHECK (length(btrim(reason)) BETWEEN 1 AND 2000),
    -- The filter the jobs were selected by (queue, job type, error code), NULL for one job.
    filter  jsonb
);

CREATE INDEX console_audit_at_idx ON leaseq.console_audit (at);

-- The newest dead jobs, of every queue and of one, with what the dead-jobs page filters on
-- (type, error code), so its bounded scan reads only the index. Dead jobs are few and rarely
-- change, so these cost the hot path nothing. jobs_dead_idx (queue, finished_at) is rebuilt
-- with the same leading columns plus those: it serves every query it served, and the planner
-- has no narrower twin to prefer for the console's (whose heap fetches would cost 20 times
-- the buffers). The build holds a write lock on leaseq.jobs for as long as it reads the dead
-- rows (a partial index: only those).
DROP INDEX leaseq.jobs_dead_idx;
CREATE INDEX jobs_dead_idx ON leaseq.jobs (queue, finished_at, id)
    INCLUDE (job_type, last_error_code) WHERE status = 'dead';
CREATE INDEX jobs_dead_recent_idx ON leaseq.jobs (finished_at, id)
    INCLUDE (queue, job_type, last_error_code) WHERE status = 'dead';

-- Which roles are console roles, as last applied by leaseq.apply_console_grants().
CREATE TABLE leaseq.console_roles (
    role_oid oid PRIMARY KEY,
    admin    boolean NOT NULL
);

-- Retries dead jobs (at most 1000 per call): each goes back to pending now with a fresh budget
-- of attempts, keeping its id, token and attempt history (as job_retry_dead does), and one
-- audit row names the jobs retried. Returns their ids.
CREATE FUNCTION leaseq.console_retry_dead(job_ids bigint[], actor text, reason text, filter jsonb DEFAULT NULL)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    done bigint[];
    queues text[];
BEGIN
    IF cardinality(job_ids) > 1000 THEN
        RAISE EXCEPTION 'at most 1000 jobs per console action, % given', cardinality(job_ids)
            USING ERRCODE = '22023';
    END IF;
    WITH revived AS (
        UPDATE leaseq.jobs j
           SET status = 'pending', available_at = now(), finished_at = NULL, lease_owner = NULL,
               max_attempts = j.attempt_count + j.max_attempts
         WHERE j.id = ANY(job_ids) AND j.status = 'dead'
        RETURNING j.id, j.queue
    )
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}'), coalesce(array_agg(DISTINCT r.queue), '{}')
      INTO done, queues
      FROM revived r;
    PERFORM pg_notify('leaseq_jobs', q) FROM unnest(queues) q;
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'retry_dead', done, coalesce(cardinality(job_ids), 0), reason, filter);
    RETURN QUERY SELECT unnest(done);
END
$fn$;

-- Cancels pending or running jobs (at most 1000 per call; a running holder is fenced from
-- then on and its attempt recorded as cancelled, as job_cancel does), with one audit row.
-- Returns their ids.
CREATE FUNCTION leaseq.console_cancel(job_ids bigint[], actor text, reason text, filter jsonb DEFAULT NULL)
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
         WHERE j.id = ANY(job_ids) AND j.status IN ('pending', 'running')
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

REVOKE ALL ON FUNCTION leaseq.console_retry_dead(bigint[], text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION leaseq.console_cancel(bigint[], text, text, jsonb) FROM PUBLIC;

-- Grants the console's role read access to what the console shows and, with admin, EXECUTE
-- on leaseq.console_retry_dead and leaseq.console_cancel (nothing else: no UPDATE, INSERT or
-- DELETE on any table). First everything on leaseq's objects is revoked from the previously
-- registered console roles and the given one, and the lqconsole_* policies are dropped, so
-- a rerun converges. A NULL role only revokes. Returns every statement run, in order. Only
-- the owner of leaseq's tables may run it; the role must not be a component's (worker,
-- operator, producer) nor a superuser, BYPASSRLS role or the owner.
CREATE FUNCTION leaseq.apply_console_grants(console regrole, admin boolean)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    owner_oid oid := (SELECT relowner FROM pg_class WHERE oid = 'leaseq.jobs'::regclass);
    r regrole;
    stmt text;
    stmts text[] := ARRAY[]::text[];
    pol record;
BEGIN
    IF NOT pg_has_role(current_user, owner_oid, 'USAGE') THEN
        RAISE EXCEPTION 'only the owner of leaseq''s tables (%) may apply grants; current user is %',
            owner_oid::regrole, current_user;
    END IF;
    IF console IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM pg_roles WHERE oid = console AND (rolsuper OR rolbypassrls)) THEN
            RAISE EXCEPTION 'role % is a superuser or has BYPASSRLS, so no policy would hold it; give the console an ordinary role', console;
        END IF;
        IF console::oid = owner_oid OR pg_has_role(console, owner_oid, 'USAGE') THEN
            RAISE EXCEPTION 'role % owns leaseq''s tables (or is a member of their owner); the console role must not', console;
        END IF;
        IF EXISTS (SELECT 1 FROM leaseq.component_roles c WHERE c.role_oid = console::oid) THEN
            RAISE EXCEPTION 'role % is a component''s role (worker, operator or producer); the console needs its own role', console;
        END IF;
    END IF;

    FOR r IN
        SELECT DISTINCT x FROM (
            SELECT c.role_oid::regrole AS x FROM leaseq.console_roles c
             WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid)
            UNION ALL SELECT console WHERE console IS NOT NULL
        ) s
    LOOP
        stmts := stmts || ARRAY[
            format('REVOKE ALL ON ALL TABLES IN SCHEMA leaseq FROM %s', r),
            format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA leaseq FROM %s', r),
            format('REVOKE ALL ON FUNCTION leaseq.console_retry_dead(bigint[], text, text, jsonb), leaseq.console_cancel(bigint[], text, text, jsonb) FROM %s', r),
            format('REVOKE ALL ON SCHEMA leaseq FROM %s', r)];
    END LOOP;
    FOR pol IN
        SELECT p.policyname, p.tablename FROM pg_policies p
         WHERE p.schemaname = 'leaseq' AND p.policyname LIKE 'lqconsole\_%'
         ORDER BY p.tablename, p.policyname
    LOOP
        stmts := stmts || format('DROP POLICY %I ON leaseq.%I', pol.policyname, pol.tablename);
    END LOOP;
    DELETE FROM leaseq.console_roles;

    IF console IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT USAGE ON SCHEMA leaseq TO %s', console),
            format('GRANT SELECT ON leaseq.schema_migrations, leaseq.jobs, leaseq.job_view, leaseq.job_whereabouts, leaseq.job_attempts, leaseq.job_results, leaseq.workers, leaseq.schedules, leaseq.schedule_slots, leaseq.job_history, leaseq.job_attempt_history, leaseq.job_ledger, leaseq.history_counts, leaseq.console_audit, leaseq.console_roles TO %s', console),
            format('CREATE POLICY lqconsole_read ON leaseq.jobs FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_attempts FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_results FOR SELECT TO %s USING (true)', console)];
        IF admin THEN
            stmts := stmts || ARRAY[
                format('GRANT EXECUTE ON FUNCTION leaseq.console_retry_dead(bigint[], text, text, jsonb) TO %s', console),
                format('GRANT EXECUTE ON FUNCTION leaseq.console_cancel(bigint[], text, text, jsonb) TO %s', console)];
        END IF;
        INSERT INTO leaseq.console_roles VALUES (console, coalesce(admin, false));
    END IF;

    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_console_grants(regrole, boolean) FROM PUBLIC;
