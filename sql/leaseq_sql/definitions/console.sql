-- leaseq's present tense: the web console's audited actions and its role's grants.
--
-- Covers: leaseq.console_retry_dead, leaseq.console_cancel, leaseq.console_cancel_pipeline,
-- leaseq.console_resolve_step (SECURITY DEFINER, executable only by a console role with
-- admin), and leaseq.apply_console_grants. Set off by: console_retry_dead, console_cancel,
-- console_cancel_pipeline, console_resolve_step and console_grants_apply in
-- queries/console.sql.

-- Retries dead jobs (at most 1000 per call): each goes back to pending now with a fresh budget
-- of attempts, keeping its id, token and attempt history (leaseq.retry_dead, as job_retry_dead
-- does: a wait it died of starts afresh), and one audit row names the jobs retried. Returns
-- their ids.
CREATE OR REPLACE FUNCTION leaseq.console_retry_dead(job_ids bigint[], actor text, reason text, filter jsonb DEFAULT NULL)
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
    WITH revived AS (SELECT r.id, r.queue FROM leaseq.retry_dead(job_ids, NULL, NULL) r)
    SELECT coalesce(array_agg(r.id ORDER BY r.id), '{}'), coalesce(array_agg(DISTINCT r.queue), '{}')
      INTO done, queues
      FROM revived r;
    PERFORM pg_notify('leaseq_jobs', q) FROM unnest(queues) q;
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'retry_dead', done, coalesce(cardinality(job_ids), 0), reason, filter);
    RETURN QUERY SELECT unnest(done);
END
$fn$;

-- Cancels jobs through the console (at most 1000 per call), waiting, pending or running, each
-- with every unfinished descendant (leaseq.cancel_jobs: "cancelled by console user <actor>:
-- <reason>", "cancelled with ancestor job N by console user ..."); one audit row names the
-- jobs cancelled. Returns their ids.
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
    SELECT coalesce(array_agg(c.id ORDER BY c.id), '{}') INTO done
      FROM leaseq.cancel_jobs(job_ids, NULL, format('console user %s', actor), reason, now()) c;
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'cancel', done, coalesce(cardinality(job_ids), 0), reason, filter);
    RETURN QUERY SELECT unnest(done);
END
$fn$;

-- Cancels every unfinished job of a pipeline, as pipeline_cancel does (leaseq.cancel_jobs:
-- "cancelled with pipeline N by console user <actor>: <reason>"), with one audit row naming
-- the jobs cancelled (filter: {"pipeline_id": id}). No cap on the number of jobs: `leaseq
-- pipelines cancel` has none, and a partial cancel would leave a pipeline half running.
-- Returns how many jobs were cancelled and how many of them were running.
CREATE OR REPLACE FUNCTION leaseq.console_cancel_pipeline(pipeline bigint, actor text, reason text)
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
$fn$;

-- Settles an uncertain durable step of a dead job as `leaseq steps resolve` does, through
-- the same function (leaseq.step_resolve, steps.sql), run as this function's owner: the
-- console's role has no UPDATE on leaseq.job_steps or leaseq.jobs. One audit row names the
-- job if it was settled (filter: {"step": name, "retry": again}). Returns the job's id; no
-- row when it was not dead at an uncertain step of that name.
CREATE OR REPLACE FUNCTION leaseq.console_resolve_step(job bigint, step text, outcome jsonb,
                                                       again boolean, actor text, reason text)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    done bigint[];
BEGIN
    SELECT coalesce(array_agg(r.id), '{}') INTO done
      FROM leaseq.step_resolve(job, step, outcome, again, actor, reason, NULL) r;
    INSERT INTO leaseq.console_audit (actor, action, job_ids, asked, reason, filter)
    VALUES (actor, 'resolve_step', done, 1, reason,
            jsonb_build_object('step', step, 'retry', again));
    RETURN QUERY SELECT unnest(done);
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.console_retry_dead(bigint[], text, text, jsonb),
    leaseq.console_cancel(bigint[], text, text, jsonb),
    leaseq.console_cancel_pipeline(bigint, text, text),
    leaseq.console_resolve_step(bigint, text, jsonb, boolean, text, text) FROM PUBLIC;

-- Grants the console's role read access to what the console shows (jobs, attempts, effects,
-- durable steps and streams, workers, schedules, history, pipelines, flow control, the audit) and, with admin, EXECUTE on
-- its four audited actions (nothing else: no UPDATE, INSERT or DELETE on any table). First
-- everything on leaseq's objects is revoked from the previously registered console roles and
-- the given one, and the lqconsole_* policies are dropped, so a rerun converges. A NULL role
-- only revokes. Returns every statement run, in order. Only the owner of leaseq's tables may
-- run it; the role must not be a component's (worker, operator, producer) nor a superuser,
-- BYPASSRLS role or the owner.
CREATE OR REPLACE FUNCTION leaseq.apply_console_grants(console regrole, admin boolean)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    owner_oid oid := (SELECT relowner FROM pg_class WHERE oid = 'leaseq.jobs'::regclass);
    actions text := 'leaseq.console_retry_dead(bigint[], text, text, jsonb), leaseq.console_cancel(bigint[], text, text, jsonb), leaseq.console_cancel_pipeline(bigint, text, text), leaseq.console_resolve_step(bigint, text, jsonb, boolean, text, text)';
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
            format('REVOKE ALL ON FUNCTION %s FROM %s', actions, r),
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
            format('GRANT SELECT ON leaseq.pipelines, leaseq.job_deps TO %s', console),
            format('GRANT SELECT ON leaseq.job_steps, leaseq.job_stream TO %s', console),
                        format('GRANT SELECT ON leaseq.flow_limits, leaseq.flow_keys, leaseq.flow_slots, leaseq.flow_aggregates TO %s', console),
            format('CREATE POLICY lqconsole_read ON leaseq.jobs FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_attempts FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_results FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_deps FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_steps FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_stream FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.pipelines FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.schedules FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.workers FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.flow_slots FOR SELECT TO %s USING (true)', console)];
        IF admin THEN
            stmts := stmts || format('GRANT EXECUTE ON FUNCTION %s TO %s', actions, console);
        END IF;
        INSERT INTO leaseq.console_roles VALUES (console, coalesce(admin, false));
    END IF;

    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
    IF console IS NOT NULL THEN
        RETURN QUERY SELECT * FROM leaseq.role_limits(console);
    END IF;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_console_grants(regrole, boolean) FROM PUBLIC;
