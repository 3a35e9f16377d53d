-- leaseq schema: every role boundary of the capabilities added last held by the database
-- (docs/guides/security.md's threat model), and input bounds no writer can skip.
--
-- 1. A new job gets the API's checks whichever way it comes in (a producer's own INSERT
--    too): a payload of at most 1,048,576 bytes as JSON, at most 1,000 attempts, a start time
--    that is finite and within 3,650 days of now, a timeout of at most 3,650 days, keys of
--    1-512 characters; refused in the API's words (leaseq.InvalidJob). leaseq.enqueue() says
--    the same about delay, timeout and max_attempts before it inserts.
-- 2. The worker's role changes a job only by claiming it or while the job runs under an
--    unexpired lease (jobs_worker_fence, its trigger made by apply_grants); it writes an
--    attempt only at the job's current token and an effect only of a running job in its
--    queue and type; it takes free units of a limit and never frees one; it writes only its
--    own rows of the workers' registry. It declares schedules only through schedule_put and
--    schedule_retire (SECURITY DEFINER; the `schedule_put` statement's upsert moved into
--    schedule_put): code schedules of its own login, checked as an enqueue is; it has no
--    INSERT or UPDATE on leaseq.schedules any more.
-- 3. A producer writes pipeline edges only between its own jobs and sees and changes only
--    its own pipelines (new column pipelines.created_by, filled from the pipeline's first
--    job for the pipelines that exist).
-- 4. A key's pause is clamped to [now, now + 1 day] (flow_pause), and leaseq.flow_resume
--    (the operator's; `leaseq limits resume`) ends one.
-- Row level security is on for job_deps, pipelines, schedules, workers and flow_slots, with
-- a policy for every role that reads or writes them (the console reads them all).

ALTER TABLE leaseq.pipelines ADD COLUMN created_by text NOT NULL DEFAULT current_user;
UPDATE leaseq.pipelines p SET created_by = j.enqueued_by
  FROM (SELECT DISTINCT ON (pipeline_id) pipeline_id, enqueued_by FROM leaseq.jobs
         WHERE pipeline_id IS NOT NULL ORDER BY pipeline_id, id) j
 WHERE j.pipeline_id = p.id;
ALTER TABLE leaseq.workers ADD COLUMN registered_by text NOT NULL DEFAULT current_user;
-- Code schedules declared so far were declared by the workers' role, where there is one.
ALTER TABLE leaseq.schedules ADD COLUMN declared_role text NOT NULL DEFAULT current_user;
UPDATE leaseq.schedules s SET declared_role = r.rolname
  FROM leaseq.component_roles c JOIN pg_roles r ON r.oid = c.role_oid
 WHERE c.component = 'worker' AND s.declared_by = 'code';

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
                        format('GRANT SELECT ON leaseq.flow_limits, leaseq.flow_keys, leaseq.flow_slots, leaseq.flow_aggregates TO %s', console),
            format('CREATE POLICY lqconsole_read ON leaseq.jobs FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_attempts FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_results FOR SELECT TO %s USING (true)', console),
            format('CREATE POLICY lqconsole_read ON leaseq.job_deps FOR SELECT TO %s USING (true)', console),
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

CREATE OR REPLACE FUNCTION leaseq.apply_grants(worker regrole, operator regrole, producer regrole)
 RETURNS SETOF text
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    owner_oid oid := (SELECT relowner FROM pg_class WHERE oid = 'leaseq.jobs'::regclass);
    given regrole[] := ARRAY[worker, operator, producer];
    previous regrole[] := ARRAY(SELECT c.role_oid::regrole FROM leaseq.component_roles c
                                 WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid));
    jobs_seq text := pg_get_serial_sequence('leaseq.jobs', 'id');
    pipelines_seq text := pg_get_serial_sequence('leaseq.pipelines', 'id');
    graph_cols text := 'id, queue, job_type, payload, priority, max_attempts, available_at, timeout, idempotency_key, created_at, status, deps_left, has_children, pipeline_id';
    producer_functions text := 'leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean), leaseq.job_status(bigint)';
    history_functions text := 'leaseq.history_ensure_partitions(integer, timestamptz), leaseq.history_expire_step(timestamptz, integer)';
    flow_functions text := 'leaseq.flow_limit_set(text, text, integer, double precision, double precision, double precision, boolean), leaseq.flow_unblock(text, text), leaseq.flow_repair(integer), leaseq.flow_resume(text, text)';
    schedule_functions text := 'leaseq.schedule_put(text, text, text, text, text, jsonb, integer, integer, leaseq.schedule_overlap, double precision, leaseq.schedule_origin, text, timestamptz), leaseq.schedule_retire(text, text[], timestamptz)';
    maintain boolean := current_setting('server_version_num')::int >= 170000;
    r regrole;
    stmt text;
    stmts text[] := ARRAY[]::text[];
    pol record;
BEGIN
    IF NOT pg_has_role(current_user, owner_oid, 'USAGE') THEN
        RAISE EXCEPTION 'only the owner of leaseq''s tables (%) may apply grants; current user is %',
            owner_oid::regrole, current_user;
    END IF;
    FOR r IN SELECT DISTINCT g FROM unnest(given) g WHERE g IS NOT NULL LOOP
        IF (SELECT count(*) FROM unnest(given) g WHERE g = r) > 1 THEN
            RAISE EXCEPTION 'role % is given for more than one component; each component needs its own role', r;
        END IF;
        IF EXISTS (SELECT 1 FROM pg_roles WHERE oid = r AND (rolsuper OR rolbypassrls)) THEN
            RAISE EXCEPTION 'role % is a superuser or has BYPASSRLS, so no policy would hold it; give the component an ordinary role', r;
        END IF;
        IF r::oid = owner_oid OR pg_has_role(r, owner_oid, 'USAGE') THEN
            RAISE EXCEPTION 'role % owns leaseq''s tables (or is a member of their owner); a component role must not', r;
        END IF;
    END LOOP;

    -- Start from nothing: old and new roles lose every privilege on leaseq's objects.
    FOR r IN SELECT DISTINCT g FROM unnest(previous || given) g WHERE g IS NOT NULL LOOP
        stmts := stmts || ARRAY[
            format('REVOKE ALL ON ALL TABLES IN SCHEMA leaseq FROM %s', r),
            format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA leaseq FROM %s', r),
            format('REVOKE ALL ON SCHEMA leaseq FROM %s', r),
            format('REVOKE ALL ON FUNCTION %s FROM %s', producer_functions, r),
            format('REVOKE ALL ON FUNCTION %s FROM %s', history_functions, r),
            format('REVOKE ALL ON FUNCTION %s, leaseq.flow_pause(text, text, timestamptz) FROM %s', flow_functions, r),
            format('REVOKE ALL ON FUNCTION %s FROM %s', schedule_functions, r)];
    END LOOP;
    FOR pol IN
        SELECT p.policyname, p.tablename FROM pg_policies p
         WHERE p.schemaname = 'leaseq' AND p.policyname LIKE 'leaseq\_%'
         ORDER BY p.tablename, p.policyname
    LOOP
        stmts := stmts || format('DROP POLICY %I ON leaseq.%I', pol.policyname, pol.tablename);
    END LOOP;
    stmts := stmts || 'DROP TRIGGER IF EXISTS leaseq_worker_fence ON leaseq.jobs'::text;
    DELETE FROM leaseq.component_roles;

    IF worker IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT USAGE ON SCHEMA leaseq TO %s', worker),
            format('GRANT SELECT ON leaseq.schema_migrations, leaseq.jobs, leaseq.job_view, leaseq.job_attempts, leaseq.job_results, leaseq.workers TO %s', worker),
            format('GRANT UPDATE (status, attempt_count, lease_token, lease_owner, started_at, heartbeat_at, lease_expires_at, progress, checkpoint, claim_id, finished_at, result, available_at, last_error, last_error_code) ON leaseq.jobs TO %s', worker),
            format('GRANT INSERT ON leaseq.job_attempts, leaseq.job_results TO %s', worker),
            format('GRANT UPDATE (outcome, ended_at, error) ON leaseq.job_attempts TO %s', worker),
            -- The registry is the workers' own table: whatever a worker reports about itself.
            format('GRANT INSERT, UPDATE, DELETE ON leaseq.workers TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.workers FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_own ON leaseq.workers FOR ALL TO %s USING (registered_by = current_user) WITH CHECK (registered_by = current_user)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.jobs FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_unfinished ON leaseq.jobs FOR UPDATE TO %s USING (status IN (''pending'', ''running'')) WITH CHECK (true)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_attempts FOR SELECT TO %s USING (true)', worker),
            -- An attempt of a job at its current token (the statement's snapshot: the one
            -- that ends it).
            format('CREATE POLICY leaseq_worker_record ON leaseq.job_attempts FOR INSERT TO %s WITH CHECK (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_attempts.job_id AND j.lease_token = job_attempts.lease_token))', worker),
            format('CREATE POLICY leaseq_worker_fence ON leaseq.job_attempts FOR UPDATE TO %s USING (outcome IN (''lease_expired'', ''cancelled'')) WITH CHECK (outcome = ''fenced'')', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_results FOR SELECT TO %s USING (true)', worker),
            -- An effect only of a job that runs (in the completion's snapshot), in its
            -- queue and type: no effect written ahead of the job that owns its key.
            format('CREATE POLICY leaseq_worker_effect ON leaseq.job_results FOR INSERT TO %s WITH CHECK (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_results.job_id AND j.status = ''running'' AND j.queue = job_results.queue AND j.job_type = job_results.job_type))', worker),
            format('CREATE TRIGGER leaseq_worker_fence BEFORE UPDATE ON leaseq.jobs FOR EACH ROW WHEN (pg_has_role(%L, ''MEMBER'') AND NOT pg_has_role(%L, ''USAGE'')) EXECUTE FUNCTION leaseq.jobs_worker_fence()', worker::text, owner_oid::regrole::text),
            -- Schedules declared in code, upserted at start-up.
            -- Declared only through schedule_put and schedule_retire (schedules.sql): code
            -- schedules of its own login, never a run-time one, a pause or a slot.
            format('GRANT SELECT ON leaseq.schedules TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.schedules FOR SELECT TO %s USING (true)', worker),
            format('GRANT EXECUTE ON FUNCTION %s TO %s', schedule_functions, worker),
            format('GRANT SELECT ON leaseq.schedule_slots TO %s', worker),
            -- Pipelines: a fan-out from a handler.
            format('GRANT SELECT, INSERT ON leaseq.job_deps, leaseq.pipelines TO %s', worker),
            format('CREATE POLICY leaseq_worker_spawn ON leaseq.job_deps FOR ALL TO %s USING (true) WITH CHECK (true)', worker),
            format('CREATE POLICY leaseq_worker_spawn ON leaseq.pipelines FOR ALL TO %s USING (true) WITH CHECK (true)', worker),
            format('GRANT UPDATE (total, finished_at) ON leaseq.pipelines TO %s', worker),
            format('GRANT INSERT (%s) ON leaseq.jobs TO %s', graph_cols, worker),
            format('GRANT UPDATE (has_children) ON leaseq.jobs TO %s', worker),
            format('GRANT USAGE ON SEQUENCE %s, %s TO %s', jobs_seq, pipelines_seq, worker),
            -- Only what a fan-out writes: unfinished jobs of a pipeline.
            format('CREATE POLICY leaseq_worker_spawn ON leaseq.jobs FOR INSERT TO %s WITH CHECK (pipeline_id IS NOT NULL AND status::text IN (''waiting'', ''pending''))', worker),
            -- Flow control: the keyed claim reads the keys and takes units and rate tokens.
            format('GRANT SELECT ON leaseq.flow_keys, leaseq.flow_limits, leaseq.flow_aggregates TO %s', worker),
            format('GRANT SELECT, UPDATE (job_id, lease_token, taken_at) ON leaseq.flow_slots TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.flow_slots FOR SELECT TO %s USING (true)', worker),
            -- A claim takes a free unit; only a job's transition (jobs_on_status, as the
            -- owner) gives one back.
            format('CREATE POLICY leaseq_worker_take ON leaseq.flow_slots FOR UPDATE TO %s USING (job_id IS NULL) WITH CHECK (job_id IS NOT NULL)', worker),
            format('GRANT SELECT, UPDATE (tokens, tokens_at) ON leaseq.flow_buckets TO %s', worker),
            format('GRANT EXECUTE ON FUNCTION leaseq.flow_pause(text, text, timestamptz) TO %s', worker)];
        INSERT INTO leaseq.component_roles VALUES ('worker', worker);
    END IF;

    IF operator IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT USAGE ON SCHEMA leaseq TO %s', operator),
            format('GRANT SELECT ON leaseq.schema_migrations, leaseq.jobs, leaseq.job_view, leaseq.job_attempts, leaseq.job_results, leaseq.workers, leaseq.leader_leases TO %s', operator),
            format('GRANT UPDATE (status, available_at, finished_at, lease_owner, lease_expires_at, last_error, last_error_code, max_attempts) ON leaseq.jobs TO %s', operator),
            format('GRANT DELETE ON leaseq.jobs TO %s', operator),
            format('GRANT INSERT, DELETE ON leaseq.job_attempts TO %s', operator),
            format('GRANT DELETE ON leaseq.workers TO %s', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.workers FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('GRANT INSERT, UPDATE, DELETE ON leaseq.leader_leases TO %s', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.jobs FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.job_attempts FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('CREATE POLICY leaseq_operator_read ON leaseq.job_results FOR SELECT TO %s USING (true)', operator),
            -- The leader's history duties.
            format('GRANT SELECT ON leaseq.job_whereabouts, leaseq.job_history, leaseq.job_attempt_history, leaseq.job_ledger, leaseq.history_retention, leaseq.history_counts, leaseq.history_mover TO %s', operator),
            format('GRANT INSERT ON leaseq.job_history, leaseq.job_attempt_history TO %s', operator),
            format('GRANT INSERT, DELETE ON leaseq.job_ledger TO %s', operator),
            format('GRANT INSERT, UPDATE, DELETE ON leaseq.history_counts, leaseq.history_retention TO %s', operator),
            format('GRANT UPDATE ON leaseq.history_mover TO %s', operator),
            format('GRANT DELETE ON leaseq.job_results TO %s', operator),
            format('CREATE POLICY leaseq_operator_expire ON leaseq.job_results FOR DELETE TO %s USING (true)', operator),
            format('GRANT EXECUTE ON FUNCTION %s TO %s', history_functions, operator),
            -- The scheduler: its slots' jobs only (their id comes from the jobs' sequence, so
            -- the slot row can name it in the same statement).
            format('GRANT SELECT, INSERT, UPDATE, DELETE ON leaseq.schedules TO %s', operator),
            format('GRANT SELECT, INSERT ON leaseq.schedule_slots TO %s', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.schedules FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('GRANT EXECUTE ON FUNCTION %s TO %s', schedule_functions, operator),
            format('GRANT INSERT (id, queue, job_type, payload, priority, max_attempts, available_at, idempotency_key, created_at) ON leaseq.jobs TO %s', operator),
            format('GRANT USAGE ON SEQUENCE %s TO %s', jobs_seq, operator),
            format('CREATE POLICY leaseq_operator_slot_jobs ON leaseq.jobs AS RESTRICTIVE FOR INSERT TO %s WITH CHECK (starts_with(idempotency_key, ''schedule:''))', operator),
            -- Pipelines: the mover's and prune's guard, `pipelines show`.
            format('GRANT SELECT, DELETE ON leaseq.job_deps TO %s', operator),
            format('GRANT SELECT ON leaseq.pipelines TO %s', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.job_deps FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.pipelines FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            -- Flow control: limits, unit repairs and blocked aggregates.
            format('GRANT SELECT ON leaseq.flow_keys, leaseq.flow_limits, leaseq.flow_slots, leaseq.flow_aggregates, leaseq.flow_repairs, leaseq.flow_buckets TO %s', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.flow_slots FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('GRANT EXECUTE ON FUNCTION %s TO %s', flow_functions, operator)];
        IF maintain THEN
            stmts := stmts || ARRAY[
                format('GRANT MAINTAIN ON leaseq.jobs TO %s', operator),
                format('GRANT MAINTAIN ON leaseq.flow_keys TO %s', operator)];
        END IF;
        INSERT INTO leaseq.component_roles VALUES ('operator', operator);
    END IF;

    IF producer IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT USAGE ON SCHEMA leaseq TO %s', producer),
            format('GRANT SELECT ON leaseq.schema_migrations, leaseq.jobs, leaseq.job_view, leaseq.job_attempts, leaseq.job_results TO %s', producer),
            format('GRANT INSERT (queue, job_type, payload, priority, max_attempts, available_at, timeout, idempotency_key, dedup_key, created_at) ON leaseq.jobs TO %s', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.jobs FOR SELECT TO %s USING (enqueued_by = current_user)', producer),
            format('CREATE POLICY leaseq_producer_enqueue ON leaseq.jobs FOR INSERT TO %s WITH CHECK (enqueued_by = current_user)', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_attempts FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_id))', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_results FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_id))', producer),
            -- Waiting for its own jobs (the policy on jobs hides the others).
            format('GRANT INSERT (notify_done), UPDATE (notify_done) ON leaseq.jobs TO %s', producer),
            format('CREATE POLICY leaseq_producer_watch ON leaseq.jobs FOR UPDATE TO %s USING (enqueued_by = current_user) WITH CHECK (enqueued_by = current_user)', producer),
            format('GRANT EXECUTE ON FUNCTION %s TO %s', producer_functions, producer),
            -- Graphs and jobs after others.
            format('GRANT SELECT, INSERT ON leaseq.job_deps, leaseq.pipelines TO %s', producer),
            format('GRANT UPDATE (total, finished_at) ON leaseq.pipelines TO %s', producer),
            format('GRANT INSERT (%s) ON leaseq.jobs TO %s', graph_cols, producer),
            format('GRANT UPDATE (has_children) ON leaseq.jobs TO %s', producer),
            format('GRANT USAGE ON SEQUENCE %s, %s TO %s', jobs_seq, pipelines_seq, producer),
            format('CREATE POLICY leaseq_producer_parent ON leaseq.jobs FOR UPDATE TO %s USING (enqueued_by = current_user) WITH CHECK (enqueued_by = current_user)', producer),
            -- Edges only between its own jobs, pipelines only its own.
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_deps FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_deps.child_id))', producer),
            format('CREATE POLICY leaseq_producer_edge ON leaseq.job_deps FOR INSERT TO %s WITH CHECK (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_deps.child_id) AND EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_deps.parent_id))', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.pipelines FOR ALL TO %s USING (created_by = current_user) WITH CHECK (created_by = current_user)', producer),
            -- A producer's jobs start unfinished, whatever columns it may set.
            format('CREATE POLICY leaseq_producer_unfinished ON leaseq.jobs AS RESTRICTIVE FOR INSERT TO %s WITH CHECK (status::text IN (''waiting'', ''pending''))', producer),
            -- Flow control: keys on the jobs it enqueues.
            format('GRANT INSERT (key, ordering_key) ON leaseq.jobs TO %s', producer)];
        INSERT INTO leaseq.component_roles VALUES ('producer', producer);
    END IF;

    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.enqueue(queue text, job_type text, payload jsonb DEFAULT 'null'::jsonb, priority integer DEFAULT 100, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, delay double precision DEFAULT 0, max_attempts integer DEFAULT 5, timeout double precision DEFAULT NULL::double precision, idempotency_key text DEFAULT NULL::text, dedup_key text DEFAULT NULL::text, wait boolean DEFAULT false)
 RETURNS TABLE(id bigint, created boolean)
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    field text;
    problem text;
    new_id bigint;
BEGIN
    -- The same rules, in the same order, as leaseq.core.validation (JobSpec.validated).
    IF enqueue.queue IS NULL OR enqueue.queue ~ '^\s*$' THEN
        field := 'queue'; problem := 'must not be empty';
    ELSIF length(enqueue.queue) > 128 THEN
        field := 'queue'; problem := format('is %s characters long; the limit is 128', length(enqueue.queue));
    ELSIF enqueue.queue !~ '^[A-Za-z0-9][A-Za-z0-9._:-]*$' THEN
        field := 'queue'; problem := format('%L is not a queue name: 1-128 characters of letters, digits and . _ : -, starting with a letter or digit', enqueue.queue);
    ELSIF enqueue.job_type IS NULL OR enqueue.job_type ~ '^\s*$' THEN
        field := 'job_type'; problem := 'must not be empty';
    ELSIF length(enqueue.job_type) > 128 THEN
        field := 'job_type'; problem := format('is %s characters long; the limit is 128', length(enqueue.job_type));
    ELSIF octet_length(coalesce(enqueue.payload, 'null')::text) > 1048576 THEN
        field := 'payload'; problem := format('is %s bytes as JSON; the limit is 1048576', octet_length(enqueue.payload::text));
    ELSIF enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN -32768 AND 32767 THEN
        field := 'priority'; problem := format('must be an integer in [-32768, 32767], got %s', coalesce(enqueue.priority::text, 'NULL'));
    ELSIF enqueue.delay IS NULL OR enqueue.delay IN ('NaN', 'Infinity', '-Infinity') THEN
        field := 'delay'; problem := format('must be a finite number, got %s', coalesce(enqueue.delay::text, 'NULL'));
    ELSIF enqueue.delay < 0 THEN
        field := 'delay'; problem := format('must not be negative, got %s', enqueue.delay);
    ELSIF enqueue.delay > 315360000 THEN
        field := 'delay'; problem := format('must be at most 315360000 seconds (3650 days), got %s', enqueue.delay);
    ELSIF enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1 THEN
        field := 'max_attempts'; problem := format('must be at least 1, got %s', coalesce(enqueue.max_attempts::text, 'NULL'));
    ELSIF enqueue.max_attempts > 1000 THEN
        field := 'max_attempts'; problem := format('must be at most 1000, got %s', enqueue.max_attempts);
    ELSIF enqueue.timeout IN ('NaN', 'Infinity', '-Infinity') THEN
        field := 'timeout'; problem := format('must be a finite number, got %s', enqueue.timeout);
    ELSIF enqueue.timeout < 0 THEN
        field := 'timeout'; problem := format('must not be negative, got %s', enqueue.timeout);
    ELSIF enqueue.timeout = 0 THEN
        field := 'timeout'; problem := 'must be greater than zero';
    ELSIF enqueue.timeout > 315360000 THEN
        field := 'timeout'; problem := format('must be at most 315360000 seconds (3650 days), got %s', enqueue.timeout);
    ELSIF enqueue.idempotency_key = '' THEN
        field := 'idempotency_key'; problem := 'must be a non-empty string or None';
    ELSIF length(enqueue.idempotency_key) > 512 THEN
        field := 'idempotency_key'; problem := format('is %s characters long; the limit is 512', length(enqueue.idempotency_key));
    ELSIF enqueue.dedup_key = '' THEN
        field := 'dedup_key'; problem := 'must be a non-empty string or None';
    ELSIF length(enqueue.dedup_key) > 512 THEN
        field := 'dedup_key'; problem := format('is %s characters long; the limit is 512', length(enqueue.dedup_key));
    END IF;
    IF field IS NOT NULL THEN
        -- Worded as leaseq.InvalidJob; leaseq.core.errors.translate turns it into one.
        RAISE EXCEPTION 'invalid %: %; nothing was written', field, problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = field, DETAIL = problem;
    END IF;

    INSERT INTO leaseq.jobs AS j (queue, job_type, payload, priority, max_attempts, available_at,
                                  timeout, idempotency_key, dedup_key, created_at, notify_done)
    VALUES (enqueue.queue, enqueue.job_type, coalesce(enqueue.payload, 'null'), enqueue.priority,
            enqueue.max_attempts,
            coalesce(enqueue.run_at, now() + make_interval(secs => enqueue.delay)),
            make_interval(secs => enqueue.timeout), enqueue.idempotency_key, enqueue.dedup_key, now(),
            coalesce(enqueue.wait, false))
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT j.id INTO new_id FROM leaseq.jobs j
         WHERE j.queue = enqueue.queue AND j.dedup_key = enqueue.dedup_key
           AND j.status IN ('pending', 'running');
        IF new_id IS NULL THEN
            RAISE EXCEPTION 'a job with dedup_key % in queue % exists but this call cannot see it: enqueued concurrently (retry to get its id) or by another database user',
                quote_literal(enqueue.dedup_key), quote_literal(enqueue.queue)
                USING ERRCODE = 'unique_violation';
        END IF;
        IF enqueue.wait THEN
            -- Committed already, maybe finishing now: the row lock orders the two (see above).
            UPDATE leaseq.jobs j SET notify_done = true
             WHERE j.id = new_id AND j.status IN ('pending', 'running') AND NOT j.notify_done;
        END IF;
        RETURN QUERY SELECT new_id, false;
        RETURN;
    END IF;
    PERFORM pg_notify('leaseq_jobs', enqueue.queue);
    RETURN QUERY SELECT new_id, true;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.flow_pause(q text, k text, until timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    UPDATE leaseq.flow_keys f
       SET paused_until = greatest(f.paused_until, least(greatest(until, now()), now() + interval '1 day'))
     WHERE f.queue = q AND f.key = k
    RETURNING f.paused_until
$function$
;

CREATE OR REPLACE FUNCTION leaseq.flow_resume(q text, k text)
 RETURNS boolean
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    WITH resumed AS (
        UPDATE leaseq.flow_keys f SET paused_until = NULL
         WHERE f.queue = q AND f.key = k AND f.paused_until IS NOT NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM resumed)
$function$
;
REVOKE ALL ON FUNCTION leaseq.flow_resume(text,text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.jobs_check_written()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    field text;
    problem text;
BEGIN
    IF NEW.queue !~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$' THEN
        RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "jobs_queue_name"'
              USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_queue_name',
                    SCHEMA = 'leaseq', TABLE = 'jobs', COLUMN = 'queue';
    END IF;
    IF length(NEW.job_type) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "jobs_job_type_name"'
              USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_job_type_name',
                    SCHEMA = 'leaseq', TABLE = 'jobs', COLUMN = 'job_type';
    END IF;
    IF NEW.timeout <= interval '0' THEN
        RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "jobs_timeout_positive"'
              USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_timeout_positive',
                    SCHEMA = 'leaseq', TABLE = 'jobs', COLUMN = 'timeout';
    END IF;
    IF TG_OP = 'INSERT' THEN
        IF octet_length(NEW.payload::text) > 1048576 THEN
            field := 'payload'; problem := format('is %s bytes as JSON; the limit is 1048576', octet_length(NEW.payload::text));
        ELSIF NEW.max_attempts > 1000 THEN
            field := 'max_attempts'; problem := format('must be at most 1000, got %s', NEW.max_attempts);
        ELSIF NOT isfinite(NEW.available_at)
              OR NEW.available_at NOT BETWEEN now() - interval '3650 days' AND now() + interval '3650 days' THEN
            field := 'run_at'; problem := format('must be a finite time within 3650 days of now, got %s', NEW.available_at);
        ELSIF NEW.timeout > interval '3650 days' THEN
            field := 'timeout'; problem := format('must be at most 315360000 seconds (3650 days), got %s', extract(epoch FROM NEW.timeout));
        ELSIF NEW.idempotency_key = '' OR NEW.dedup_key = '' THEN
            field := CASE WHEN NEW.idempotency_key = '' THEN 'idempotency_key' ELSE 'dedup_key' END;
            problem := 'must be a non-empty string or None';
        ELSIF length(NEW.idempotency_key) > 512 OR length(NEW.dedup_key) > 512 THEN
            field := CASE WHEN length(NEW.idempotency_key) > 512 THEN 'idempotency_key' ELSE 'dedup_key' END;
            problem := format('is %s characters long; the limit is 512', greatest(length(NEW.idempotency_key), length(NEW.dedup_key)));
        END IF;
        IF field IS NOT NULL THEN
            RAISE EXCEPTION 'invalid %: %; nothing was written', field, problem
                USING ERRCODE = 'invalid_parameter_value', COLUMN = field, DETAIL = problem;
        END IF;
    END IF;
    RETURN NEW;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.jobs_worker_fence()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    marked leaseq.jobs := OLD;
BEGIN
    marked.has_children := NEW.has_children;
    IF marked IS NOT DISTINCT FROM NEW THEN
        RETURN NEW;
    END IF;
    IF NOT ((OLD.status = 'pending' AND NEW.status = 'running'
             AND NEW.lease_token = OLD.lease_token + 1)
            OR (OLD.status = 'running' AND OLD.lease_expires_at > now()
                AND (NEW.lease_token = OLD.lease_token
                     OR (NEW.status = 'pending' AND NEW.lease_token = OLD.lease_token + 1)))) THEN
        RAISE EXCEPTION 'a worker may change job % only by claiming it or while it holds its lease; it is % with token %',
            OLD.id, OLD.status, OLD.lease_token
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.available_at IS DISTINCT FROM OLD.available_at
       AND NOT (isfinite(NEW.available_at) AND NEW.available_at <= now() + interval '3650 days') THEN
        RAISE EXCEPTION 'invalid run_at: must be a finite time within 3650 days of now, got %; nothing was written', NEW.available_at
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'run_at';
    END IF;
    RETURN NEW;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.jobs_worker_fence() FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.schedule_put(name text, cron text, timezone text, queue text, job_type text, payload jsonb, priority integer, max_attempts integer, overlap leaseq.schedule_overlap, catchup_seconds double precision, declared_by leaseq.schedule_origin, declared_in text, at timestamp with time zone)
 RETURNS TABLE(schedule text, created boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    field text;
    problem text;
BEGIN
    IF schedule_put.declared_by <> 'code'
       AND NOT has_table_privilege(session_user, 'leaseq.schedules', 'UPDATE') THEN
        RAISE EXCEPTION 'role % may declare only code schedules; run-time schedules are the operator''s (`leaseq schedules add`)', session_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF schedule_put.queue IS NULL OR schedule_put.queue !~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$' THEN
        field := 'queue'; problem := format('%L is not a queue name', schedule_put.queue);
    ELSIF length(schedule_put.job_type) NOT BETWEEN 1 AND 128 THEN
        field := 'job_type'; problem := 'must be 1-128 characters';
    ELSIF octet_length(coalesce(schedule_put.payload, 'null')::text) > 1048576 THEN
        field := 'payload'; problem := format('is %s bytes as JSON; the limit is 1048576', octet_length(schedule_put.payload::text));
    ELSIF schedule_put.priority IS NULL OR schedule_put.priority NOT BETWEEN -32768 AND 32767 THEN
        field := 'priority'; problem := format('must be an integer in [-32768, 32767], got %s', coalesce(schedule_put.priority::text, 'NULL'));
    ELSIF schedule_put.max_attempts IS NULL OR schedule_put.max_attempts NOT BETWEEN 1 AND 1000 THEN
        field := 'max_attempts'; problem := format('must be between 1 and 1000, got %s', coalesce(schedule_put.max_attempts::text, 'NULL'));
    ELSIF NOT (schedule_put.catchup_seconds BETWEEN 0 AND 315360000) THEN
        field := 'catchup_seconds'; problem := format('must be between 0 and 315360000, got %s', schedule_put.catchup_seconds);
    END IF;
    IF field IS NOT NULL THEN
        RAISE EXCEPTION 'invalid %: %; nothing was written', field, problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = field, DETAIL = problem;
    END IF;
    RETURN QUERY
    INSERT INTO leaseq.schedules AS s
           (name, cron, timezone, queue, job_type, payload, priority, max_attempts, overlap,
            catchup_seconds, declared_by, declared_in, declared_role, fire_after, created_at,
            updated_at)
    VALUES (schedule_put.name, schedule_put.cron, schedule_put.timezone, schedule_put.queue,
            schedule_put.job_type, schedule_put.payload, schedule_put.priority,
            schedule_put.max_attempts, schedule_put.overlap, schedule_put.catchup_seconds,
            schedule_put.declared_by, schedule_put.declared_in, session_user, schedule_put.at,
            schedule_put.at, schedule_put.at)
    ON CONFLICT (name) DO UPDATE
       SET cron = excluded.cron, timezone = excluded.timezone, queue = excluded.queue,
           job_type = excluded.job_type, payload = excluded.payload, priority = excluded.priority,
           max_attempts = excluded.max_attempts, overlap = excluded.overlap,
           catchup_seconds = excluded.catchup_seconds, declared_in = excluded.declared_in,
           enabled = true, disabled_reason = NULL,
           fire_after = CASE WHEN s.cron <> excluded.cron OR s.timezone <> excluded.timezone
                                  OR NOT s.enabled
                             THEN excluded.updated_at ELSE s.fire_after END,
           updated_at = CASE WHEN (s.cron, s.timezone, s.queue, s.job_type, s.payload, s.priority,
                                   s.max_attempts, s.overlap, s.catchup_seconds, s.enabled,
                                   s.declared_in)
                                  IS NOT DISTINCT FROM
                                  (excluded.cron, excluded.timezone, excluded.queue,
                                   excluded.job_type, excluded.payload, excluded.priority,
                                   excluded.max_attempts, excluded.overlap,
                                   excluded.catchup_seconds, true, excluded.declared_in)
                             THEN s.updated_at ELSE excluded.updated_at END
     WHERE s.declared_by = excluded.declared_by
       AND (s.declared_by <> 'code'
            OR EXISTS (SELECT 1 FROM pg_roles r
                        WHERE r.rolname = s.declared_role AND pg_has_role(session_user, r.oid, 'MEMBER')))
    RETURNING s.name, (s.xmax = 0);
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.schedule_put(text,text,text,text,text,jsonb,integer,integer,leaseq.schedule_overlap,double precision,leaseq.schedule_origin,text,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.schedule_retire(app text, names text[], at timestamp with time zone)
 RETURNS SETOF text
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    UPDATE leaseq.schedules s
       SET enabled = false, disabled_reason = 'no longer declared by ' || app, updated_at = at
     WHERE s.declared_by = 'code' AND s.declared_in = app AND s.enabled
       AND NOT (s.name = ANY(names))
       AND EXISTS (SELECT 1 FROM pg_roles r
                    WHERE r.rolname = s.declared_role AND pg_has_role(session_user, r.oid, 'MEMBER'))
    RETURNING s.name
$function$
;
REVOKE ALL ON FUNCTION leaseq.schedule_retire(text,text[],timestamp with time zone) FROM PUBLIC;

ALTER TABLE leaseq.flow_slots ENABLE ROW LEVEL SECURITY;

ALTER TABLE leaseq.job_deps ENABLE ROW LEVEL SECURITY;

ALTER TABLE leaseq.pipelines ENABLE ROW LEVEL SECURITY;

ALTER TABLE leaseq.schedules ENABLE ROW LEVEL SECURITY;

ALTER TABLE leaseq.workers ENABLE ROW LEVEL SECURITY;
