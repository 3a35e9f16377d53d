-- leaseq schema: the web console settles an uncertain durable step (docs/guides/console.md,
-- "A job's steps"; docs/concepts/steps.md).
--
-- leaseq.step_resolve (steps.sql) is now the one statement that settles a step: the named
-- statement step_resolve (`leaseq steps resolve`, the operator's role) calls it as its
-- caller, and leaseq.console_resolve_step (console.sql, SECURITY DEFINER, EXECUTE only for a
-- console role with admin) calls it as the owner and writes a console_audit row (action
-- resolve_step) in the same transaction. The console role gains no table privilege.
-- apply_console_grants() grants the new function from now on; the admin console role
-- already registered gets it at the end of this migration, so an upgraded console settles
-- steps without a second `leaseq migrate --console-role` run.

ALTER TABLE leaseq.console_audit DROP CONSTRAINT console_audit_action;
ALTER TABLE leaseq.console_audit ADD CONSTRAINT console_audit_action
    CHECK (action IN ('retry_dead', 'cancel', 'cancel_pipeline', 'resolve_step'));

CREATE OR REPLACE FUNCTION leaseq.apply_console_grants(console regrole, admin boolean)
 RETURNS SETOF text
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.console_resolve_step(job bigint, step text, outcome jsonb, again boolean, actor text, reason text)
 RETURNS TABLE(id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
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
$function$
;
REVOKE ALL ON FUNCTION leaseq.console_resolve_step(bigint,text,jsonb,boolean,text,text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.step_resolve(job bigint, step text, outcome jsonb, again boolean, actor text, reason text, at timestamp with time zone)
 RETURNS TABLE(id bigint, notified bigint)
 LANGUAGE sql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    WITH t AS (SELECT coalesce(step_resolve.at, now()) AS now),
    settled AS (
        UPDATE leaseq.job_steps s
           SET finished_at = CASE WHEN step_resolve.again THEN NULL ELSE t.now END,
               result = CASE WHEN step_resolve.again THEN NULL ELSE step_resolve.outcome END,
               attempt = CASE WHEN step_resolve.again THEN NULL ELSE s.attempt END,
               lease_token = CASE WHEN step_resolve.again THEN NULL ELSE s.lease_token END,
               intended_at = CASE WHEN step_resolve.again THEN NULL ELSE s.intended_at END,
               resolved_by = step_resolve.actor, resolved_at = t.now,
               resolve_reason = step_resolve.reason
          FROM t, leaseq.jobs j
         WHERE s.job_id = step_resolve.job AND s.name = step_resolve.step AND j.id = s.job_id
           AND j.status = 'dead' AND s.finished_at IS NULL AND s.lease_token IS NOT NULL
        RETURNING s.job_id
    ),
    revived AS (
        UPDATE leaseq.jobs j
           SET status = 'pending', available_at = t.now, finished_at = NULL, lease_owner = NULL,
               max_attempts = j.attempt_count + j.max_attempts
          FROM t, settled
         WHERE j.id = settled.job_id AND j.status = 'dead'
        RETURNING j.id, j.queue
    ),
    woke AS (SELECT pg_notify('leaseq_jobs', revived.queue) FROM revived)
    SELECT revived.id, (SELECT count(*) FROM woke) FROM revived
$function$
;

-- The admin console role already registered may settle steps from now on.
DO $do$
DECLARE
    r regrole;
BEGIN
    FOR r IN
        SELECT c.role_oid::regrole FROM leaseq.console_roles c
         WHERE c.admin AND EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION leaseq.console_resolve_step(bigint, text, jsonb, boolean, text, text) TO %s', r);
    END LOOP;
END
$do$;
