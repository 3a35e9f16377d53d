-- leaseq schema: the web console shows a job's durable steps and its stream's size
-- (docs/guides/console.md, "A job's steps").
--
-- The console role may read leaseq.job_steps and leaseq.job_stream, every row (policies
-- lqconsole_read, as on the other tables it reads); the job page shows each step's state and
-- its result through the console's redactor, and says which step a job stopped at. No new
-- function: settling a step stays `leaseq steps resolve` (the operator's role).
-- apply_console_grants() grants both from now on; the console role already registered gets
-- them here, so an upgraded console reads steps without a second `leaseq migrate
-- --console-role` run.

DO $do$
DECLARE
    r regrole;
BEGIN
    FOR r IN
        SELECT c.role_oid::regrole FROM leaseq.console_roles c
         WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid)
    LOOP
        EXECUTE format('GRANT SELECT ON leaseq.job_steps, leaseq.job_stream TO %s', r);
        EXECUTE format('CREATE POLICY lqconsole_read ON leaseq.job_steps FOR SELECT TO %s USING (true)', r);
        EXECUTE format('CREATE POLICY lqconsole_read ON leaseq.job_stream FOR SELECT TO %s USING (true)', r);
    END LOOP;
END
$do$;

CREATE OR REPLACE FUNCTION leaseq.apply_console_grants(console regrole, admin boolean)
 RETURNS SETOF text
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    owner_oid oid := (SELECT relowner FROM pg_class WHERE oid = 'leaseq.jobs'::regclass);
    actions text := 'leaseq.console_retry_dead(bigint[], text, text, jsonb), leaseq.console_cancel(bigint[], text, text, jsonb), leaseq.console_cancel_pipeline(bigint, text, text)';
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
