-- leaseq schema: a job carries the trace it was enqueued in (OpenTelemetry, issue 63).
-- jobs.trace_context holds the W3C trace headers (traceparent, tracestate) of the span that
-- enqueued the job, so the worker that runs it continues that trace: the enqueue writes it
-- (a producer may: its INSERT grant names it), leaseq.enqueue() takes it as two arguments
-- (a producer in another language passes its own), a schedule's firing writes its own (the
-- operator's INSERT grant names it), a handler's fan-out (lease_spawn) copies its spawner's,
-- and jobs_check_written bounds it at insert (a JSON object of at most 1,024 bytes). The
-- claims return it with the job. A new row type or signature is a new function, so the claims
-- and leaseq.enqueue are dropped and created again; their grants come back with apply_grants
-- (`leaseq migrate` re-grants the registered roles: grants_reapply). Nullable, no default:
-- adding it rewrites nothing, and an untraced job stores nothing.

ALTER TABLE leaseq.jobs ADD COLUMN trace_context jsonb;
-- History keeps it: a finished job's trace can still be looked up (the mover copies it).
ALTER TABLE leaseq.job_history ADD COLUMN trace_context jsonb;
-- The claims return it: a new row type is a new function (their grants: see above).
DROP FUNCTION leaseq.lease_claim(text[], text[], text, integer, double precision, uuid, bytea, timestamptz);
DROP FUNCTION leaseq.lease_claim_keyed(text[], text[], text, integer, double precision, uuid, bytea, timestamptz);
DROP FUNCTION leaseq.lease_claim_keyed_slots(text[], text[], text, integer, double precision, uuid, bytea, timestamptz);
DROP FUNCTION leaseq.lease_claim_keyed_open(text[], text[], text, integer, double precision, uuid, bytea, timestamptz);
-- leaseq.enqueue() takes the trace context: a new signature (its grant: see above).
DROP FUNCTION leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean);

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
    graph_cols text := 'id, queue, job_type, payload, priority, max_attempts, available_at, timeout, idempotency_key, created_at, status, deps_left, has_children, pipeline_id, key, enqueued_by';
    producer_functions text := 'leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean, text, text), leaseq.job_status(bigint), leaseq.stream_read(bigint, bigint, integer), leaseq.producer_cancel(bigint, text), leaseq.producer_cancel_pipeline(bigint, text), leaseq.queue_roles_exist(), leaseq.queue_open(text, text)';
    signal_function text := 'leaseq.signal(bigint, text, jsonb)';
    history_functions text := 'leaseq.history_ensure_partitions(integer, timestamptz), leaseq.history_expire_step(timestamptz, integer)';
    flow_functions text := 'leaseq.flow_limit_set(text, text, integer, double precision, double precision, double precision, boolean), leaseq.flow_unblock(text, text), leaseq.flow_repair(integer), leaseq.flow_settle(integer, double precision), leaseq.flow_resume(text, text), leaseq.flow_pause(text, text, timestamptz)';
    schedule_functions text := 'leaseq.schedule_put(text, text, text, text, text, jsonb, integer, integer, leaseq.schedule_overlap, double precision, leaseq.schedule_origin, text, timestamptz), leaseq.schedule_retire(text, text[], timestamptz)';
    lease_functions text := 'leaseq.lease_claim(text[], text[], text, integer, double precision, uuid, bytea, timestamptz), leaseq.lease_claim_keyed(text[], text[], text, integer, double precision, uuid, bytea, timestamptz), leaseq.lease_claim_keyed_slots(text[], text[], text, integer, double precision, uuid, bytea, timestamptz), leaseq.lease_claim_keyed_open(text[], text[], text, integer, double precision, uuid, bytea, timestamptz), leaseq.lease_heartbeat_many(bigint[], text[], bigint[], bytea[], jsonb[], double precision, timestamptz), leaseq.lease_checkpoint(bigint, text, bigint, bytea, jsonb, timestamptz), leaseq.lease_complete(bigint[], text[], bigint[], bytea[], jsonb[], text[], jsonb[], text[], timestamptz), leaseq.lease_fail(bigint, text, bigint, bytea, text, text, text, boolean, leaseq.attempt_outcome, double precision, double precision, timestamptz), leaseq.lease_release(bigint, text, bigint, bytea, timestamptz, text, boolean, double precision, double precision, timestamptz), leaseq.lease_back_off(bigint, text, bigint, bytea, timestamptz, double precision, text, timestamptz), leaseq.lease_sleep(bigint, text, bigint, bytea, timestamptz, timestamptz, timestamptz), leaseq.lease_wait(bigint, text, bigint, bytea, timestamptz, text, timestamptz, timestamptz), leaseq.lease_refused(bigint, text, bigint, bytea, integer, timestamptz, text, timestamptz), leaseq.lease_step_intend(bigint, text, bigint, bytea, text, bigint, timestamptz), leaseq.lease_step_record(bigint, text, bigint, bytea, text, jsonb, text, timestamptz), leaseq.lease_step_withdraw(bigint, text, bigint, bytea, text, timestamptz), leaseq.lease_emit(bigint, text, bigint, bytea, jsonb, integer, timestamptz), leaseq.lease_signal(bigint, text, bigint, bytea, text, timestamptz), leaseq.lease_spawn_lock(bigint, text, bigint, bytea, bigint[], timestamptz), leaseq.lease_spawn(bigint, text, bigint, bytea, text, text[], text[], jsonb[], smallint[], integer[], timestamptz[], double precision[], double precision[], text[], integer[], boolean[], text[], boolean[], bigint[], bigint[], text[], boolean[], timestamptz)';
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
            format('REVOKE ALL ON FUNCTION %s FROM %s', signal_function, r),
            format('REVOKE ALL ON FUNCTION %s FROM %s', history_functions, r),
            format('REVOKE ALL ON FUNCTION %s FROM %s', flow_functions, r),
            format('REVOKE ALL ON FUNCTION %s FROM %s', schedule_functions, r),
            format('REVOKE ALL ON FUNCTION %s FROM %s', lease_functions, r)];
    END LOOP;
    FOR pol IN
        SELECT p.policyname, p.tablename FROM pg_policies p
         WHERE p.schemaname = 'leaseq' AND p.policyname LIKE 'leaseq\_%'
         ORDER BY p.tablename, p.policyname
    LOOP
        stmts := stmts || format('DROP POLICY %I ON leaseq.%I', pol.policyname, pol.tablename);
    END LOOP;
    DELETE FROM leaseq.component_roles;

    IF worker IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT USAGE ON SCHEMA leaseq TO %s', worker),
            format('GRANT SELECT ON leaseq.schema_migrations, leaseq.jobs, leaseq.job_view, leaseq.job_attempts, leaseq.job_results, leaseq.workers TO %s', worker),
            -- A job is claimed and changed under its lease only through the worker's door
            -- (the lease_* functions), which mints and checks the lease's secret.
            format('GRANT EXECUTE ON FUNCTION %s TO %s', lease_functions, worker),
            -- The registry is the workers' own table: whatever a worker reports about itself.
            format('GRANT INSERT, UPDATE, DELETE ON leaseq.workers TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.workers FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_own ON leaseq.workers FOR ALL TO %s USING (registered_by = current_user) WITH CHECK (registered_by = current_user)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.jobs FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_attempts FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_results FOR SELECT TO %s USING (true)', worker),
            -- Schedules declared in code, upserted at start-up.
            -- Declared only through schedule_put and schedule_retire (schedules.sql): code
            -- schedules of its own login, never a run-time one, a pause or a slot.
            format('GRANT SELECT ON leaseq.schedules TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.schedules FOR SELECT TO %s USING (true)', worker),
            format('GRANT EXECUTE ON FUNCTION %s TO %s', schedule_functions, worker),
            format('GRANT SELECT ON leaseq.schedule_slots TO %s', worker),
            -- Pipelines: read; a fan-out from a handler is written through the door
            -- (lease_spawn_lock, lease_spawn), for a job the caller holds.
            format('GRANT SELECT ON leaseq.job_deps, leaseq.pipelines TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_deps FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.pipelines FOR SELECT TO %s USING (true)', worker),
            -- Flow control: read; a claim (a lease_claim_* function) takes a free unit and
            -- rate tokens, and only a job's transition (jobs_on_status, as the owner) gives
            -- a unit back.
            format('GRANT SELECT ON leaseq.flow_keys, leaseq.flow_limits, leaseq.flow_aggregates, leaseq.flow_slots, leaseq.flow_buckets TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.flow_slots FOR SELECT TO %s USING (true)', worker),
            -- Durable steps and streams: read (a step's record, ctx.step); written only
            -- through the worker's door. Signals: read only through it (lease_signal).
            format('GRANT SELECT ON leaseq.job_steps, leaseq.job_stream TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_steps FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_stream FOR SELECT TO %s USING (true)', worker)];
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
            format('GRANT INSERT (id, queue, job_type, payload, priority, max_attempts, available_at, idempotency_key, created_at, trace_context) ON leaseq.jobs TO %s', operator),
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
            format('GRANT EXECUTE ON FUNCTION %s TO %s', flow_functions, operator),
            -- Durable steps: `leaseq steps resolve` settles an uncertain one (the deletes
            -- come with the job's, ON DELETE CASCADE).
            format('GRANT SELECT, UPDATE (attempt, lease_token, intended_at, finished_at, result, note, resolved_by, resolved_at, resolve_reason) ON leaseq.job_steps TO %s', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.job_steps FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('GRANT SELECT ON leaseq.job_stream TO %s', operator),
            format('CREATE POLICY leaseq_operator_read ON leaseq.job_stream FOR SELECT TO %s USING (true)', operator),
            -- Signals: `leaseq signal` and `jobs show` for any job.
            format('GRANT SELECT, INSERT (job_id, name, payload) ON leaseq.job_signals TO %s', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.job_signals FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('GRANT EXECUTE ON FUNCTION %s TO %s', signal_function, operator)];
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
            format('GRANT INSERT (queue, job_type, payload, priority, max_attempts, available_at, timeout, idempotency_key, dedup_key, created_at, trace_context) ON leaseq.jobs TO %s', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.jobs FOR SELECT TO %s USING (enqueued_by = current_user)', producer),
            format('CREATE POLICY leaseq_producer_enqueue ON leaseq.jobs FOR INSERT TO %s WITH CHECK (enqueued_by = current_user)', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_attempts FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_id))', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_results FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_id))', producer),
            format('GRANT SELECT ON leaseq.job_steps TO %s', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_steps FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_id))', producer),
            format('GRANT SELECT ON leaseq.job_stream TO %s', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_stream FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_id))', producer),
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
            -- ... into a queue open to its login (tenants.sql); asked once per statement
            -- while no queue is given to roles.
            format('CREATE POLICY leaseq_producer_queue ON leaseq.jobs AS RESTRICTIVE FOR INSERT TO %s WITH CHECK ((SELECT NOT leaseq.queue_roles_exist()) OR leaseq.queue_open(queue, ''producer''))', producer),
            -- ... and in no pipeline but one of its own: another producer's pipeline is not
            -- joined, counted into or finished by a job it puts there.
            format('CREATE POLICY leaseq_producer_pipeline ON leaseq.jobs AS RESTRICTIVE FOR INSERT TO %s WITH CHECK (pipeline_id IS NULL OR EXISTS (SELECT 1 FROM leaseq.pipelines p WHERE p.id = jobs.pipeline_id AND p.created_by = current_user))', producer),
            -- Flow control: keys on the jobs it enqueues.
            format('GRANT INSERT (key, ordering_key) ON leaseq.jobs TO %s', producer),
            -- Signals only to its own jobs, as itself (sent_by is its login).
            format('GRANT SELECT, INSERT (job_id, name, payload) ON leaseq.job_signals TO %s', producer),
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_signals FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_signals.job_id))', producer),
            format('CREATE POLICY leaseq_producer_signal ON leaseq.job_signals FOR INSERT TO %s WITH CHECK (sent_by = current_user AND EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_signals.job_id))', producer),
            format('GRANT EXECUTE ON FUNCTION %s TO %s', signal_function, producer)];
        INSERT INTO leaseq.component_roles VALUES ('producer', producer);
    END IF;

    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
    FOR r IN SELECT DISTINCT g FROM unnest(given) g WHERE g IS NOT NULL LOOP
        RETURN QUERY SELECT * FROM leaseq.role_limits(r);
    END LOOP;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.enqueue(queue text, job_type text, payload jsonb DEFAULT 'null'::jsonb, priority integer DEFAULT 100, run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, delay double precision DEFAULT 0, max_attempts integer DEFAULT 5, timeout double precision DEFAULT NULL::double precision, idempotency_key text DEFAULT NULL::text, dedup_key text DEFAULT NULL::text, wait boolean DEFAULT false, traceparent text DEFAULT NULL::text, tracestate text DEFAULT NULL::text)
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
    ELSIF enqueue.traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        field := 'traceparent'; problem := format('must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), got %L', left(enqueue.traceparent, 64));
    ELSIF enqueue.tracestate IS NOT NULL AND enqueue.traceparent IS NULL THEN
        field := 'tracestate'; problem := 'needs a traceparent';
    ELSIF length(enqueue.tracestate) > 512 THEN
        field := 'tracestate'; problem := format('is %s characters long; the limit is 512', length(enqueue.tracestate));
    END IF;
    IF field IS NOT NULL THEN
        -- Worded as leaseq.InvalidJob; leaseq.core.errors.translate turns it into one.
        RAISE EXCEPTION 'invalid %: %; nothing was written', field, problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = field, DETAIL = problem;
    END IF;

    INSERT INTO leaseq.jobs AS j (queue, job_type, payload, priority, max_attempts, available_at,
                                  timeout, idempotency_key, dedup_key, created_at, notify_done,
                                  trace_context)
    VALUES (enqueue.queue, enqueue.job_type, coalesce(enqueue.payload, 'null'), enqueue.priority,
            enqueue.max_attempts,
            coalesce(enqueue.run_at, now() + make_interval(secs => enqueue.delay)),
            make_interval(secs => enqueue.timeout), enqueue.idempotency_key, enqueue.dedup_key, now(),
            coalesce(enqueue.wait, false),
            CASE WHEN enqueue.traceparent IS NOT NULL
                 THEN jsonb_strip_nulls(jsonb_build_object('traceparent', enqueue.traceparent,
                                                           'tracestate', enqueue.tracestate))
            END)
    ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running')
    DO NOTHING
    RETURNING j.id INTO new_id;
    IF new_id IS NULL THEN
        SELECT j.id INTO new_id FROM leaseq.jobs j
         WHERE j.queue = enqueue.queue AND j.dedup_key = enqueue.dedup_key
           AND j.status IN ('pending', 'running');
        IF new_id IS NULL THEN
            -- Worded so it does not tell whose job holds the key (docs/guides/security.md).
            RAISE EXCEPTION 'dedup_key % in queue % is held by an unfinished job this call cannot read: retry to get its id if it was enqueued concurrently; dedup keys are per queue across all producers, so make yours unique to your application (a prefix)',
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
REVOKE ALL ON FUNCTION leaseq.enqueue(text,text,jsonb,integer,timestamp with time zone,double precision,integer,double precision,text,text,boolean,text,text) FROM PUBLIC;

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
        ELSIF jsonb_typeof(NEW.trace_context) <> 'object' THEN
            field := 'trace_context'; problem := format('must be a JSON object of W3C trace headers, got a JSON %s', jsonb_typeof(NEW.trace_context));
        ELSIF octet_length(NEW.trace_context::text) > 1024 THEN
            field := 'trace_context'; problem := format('is %s bytes as JSON; the limit is 1024', octet_length(NEW.trace_context::text));
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

CREATE OR REPLACE FUNCTION leaseq.lease_claim(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, trace_context jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim.at);
    claim_start timestamptz := CASE WHEN lease_claim.at IS NOT NULL THEN claim_now END;
BEGIN
    lease_claim.queues := leaseq.lease_queues(lease_claim.queues);
    RETURN QUERY
    WITH candidate AS (
        SELECT c.id
          FROM unnest(lease_claim.queues) AS q(queue)
          CROSS JOIN LATERAL (
              SELECT j.id, j.priority, j.available_at
                FROM leaseq.jobs j
               WHERE j.status = 'pending' AND j.queue = q.queue AND j.available_at <= claim_now
                 -- Keyed and waiting ordered jobs are claimed by lease_claim_keyed (below).
                 AND j.key IS NULL AND NOT j.ordering_waiting
                 -- A filter on the claim index's scan, not a key of it: the index stays the one
                 -- every claimer walks; jobs of types this worker does not serve are stepped over.
                 AND (lease_claim.job_types IS NULL OR j.job_type = ANY(lease_claim.job_types))
               ORDER BY j.priority, j.available_at, j.id
               LIMIT lease_claim.lim
                 FOR UPDATE SKIP LOCKED
          ) c
         ORDER BY c.priority, c.available_at, c.id
         LIMIT lease_claim.lim
    ),
    claimed AS (
        UPDATE leaseq.jobs j
           SET status = 'running',
               -- Whatever it waited for (ctx.wait_for) is over: it runs.
               waiting_for = NULL, waiting_since = NULL,
               attempt_count = j.attempt_count + 1,
               lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
               lease_owner = lease_claim.holder,
               claim_id = lease_claim.claim_id,
               -- Only the lease's digest: sha256(the claim's secret || id) (leaseq.core.capability).
               lease_digest = sha256(lease_claim.claim_secret || int8send(j.id)),
               started_at = claim_now,
               heartbeat_at = claim_now,
               lease_expires_at = claim_now + least(make_interval(secs => lease_claim.lease_seconds),
                                                coalesce(j.timeout, make_interval(secs => lease_claim.lease_seconds)))
         -- An array, not a join: the generic plan cannot see LIMIT and would hash-join a
         -- sequential scan of jobs against the candidates; this plan is an index scan either way.
         WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
        RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
                  j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
                  extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
                  j.idempotency_key, j.checkpoint, j.trace_context
    )
    SELECT * FROM claimed ORDER BY priority, available_at, id;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_claim(text[],text[],text,integer,double precision,uuid,bytea,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, trace_context jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed.at IS NOT NULL THEN claim_now END;
BEGIN
    lease_claim_keyed.queues := leaseq.lease_queues(lease_claim_keyed.queues);
    RETURN QUERY
    WITH candidate AS (
        SELECT c.id, c.queue, c.key, c.slot, c.bucket, c.lease_token, c.rated
          FROM unnest(lease_claim_keyed.queues) AS q(queue)
          CROSS JOIN LATERAL (
              SELECT k.queue, k.key, s.slots[j.n] AS slot, r.bucket, j.id, j.lease_token, k.rated
                FROM leaseq.flow_keys k
                -- shared: keyed_slots
                -- A limited key's free slots (their ids), locked, at most lease_claim_keyed.lim (NULL for an
                -- unlimited key). The slots first: a saturated key's pending rows are never read.
                CROSS JOIN LATERAL (
                    SELECT array_agg(x.id) AS slots FROM (
                        SELECT x.id FROM leaseq.flow_slots x
                         WHERE k.max_running IS NOT NULL
                           AND x.queue = k.queue AND x.key = k.key AND x.job_id IS NULL AND NOT x.retired
                         LIMIT lease_claim_keyed.lim
                           FOR UPDATE SKIP LOCKED
                    ) x
                ) s
                -- end shared: keyed_slots
                -- A rate-limited key's bucket, locked: its id and the starts it allows now (a
                -- bucket last filled at -infinity is full, one at infinity gains nothing).
                LEFT JOIN LATERAL (
                    SELECT b.id AS bucket, floor(least(b.burst, b.tokens + b.per_second
                                       * greatest(CASE WHEN isfinite(b.tokens_at) THEN extract(epoch FROM claim_now - b.tokens_at)
                                                     WHEN b.tokens_at < 'epoch' THEN 'Infinity' END, 0)))::int AS allows
                      FROM leaseq.flow_buckets b
                     WHERE k.rated AND b.queue = k.queue AND b.key = k.key
                       FOR UPDATE SKIP LOCKED
                ) r ON true
                -- shared: keyed_ready
                -- Key k's ready jobs in order, numbered; how many (the LIMIT below) differs.
                CROSS JOIN LATERAL (
                    SELECT r.id, r.lease_token, row_number() OVER () AS n FROM (
                        SELECT j.id, j.lease_token
                          FROM leaseq.jobs j
                         WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                           AND j.queue = k.queue AND j.key = k.key AND j.available_at <= claim_now
                           AND (lease_claim_keyed.job_types IS NULL OR j.job_type = ANY(lease_claim_keyed.job_types))
                         ORDER BY j.priority, j.available_at, j.id
                -- end shared: keyed_ready
                         LIMIT least(CASE WHEN k.max_running IS NULL THEN lease_claim_keyed.lim
                                          ELSE coalesce(cardinality(s.slots), 0) END,
                                     CASE WHEN k.rated THEN r.allows ELSE lease_claim_keyed.lim END)
                           FOR UPDATE SKIP LOCKED
                    ) r
                ) j
               WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
                 AND (k.paused_until IS NULL OR k.paused_until <= claim_now)
                 AND (k.max_running IS NULL OR s.slots IS NOT NULL)
                 AND (NOT k.rated OR r.allows >= 1)
               ORDER BY k.vtime, k.key
               LIMIT lease_claim_keyed.lim
          ) c
         LIMIT lease_claim_keyed.lim
    ),
    spent AS (
        UPDATE leaseq.flow_buckets b
           SET tokens = least(b.burst, b.tokens + b.per_second
                                       * greatest(CASE WHEN isfinite(b.tokens_at) THEN extract(epoch FROM claim_now - b.tokens_at)
                                                     WHEN b.tokens_at < 'epoch' THEN 'Infinity' END, 0)) - c.n,
               tokens_at = greatest(b.tokens_at, claim_now)
          FROM (SELECT x.bucket, count(*) AS n FROM candidate x WHERE x.rated GROUP BY x.bucket) c
         -- An array, not only a join: the generic plan cannot see how few candidates there are
         -- and would hash-join a sequential scan of the table; this is an index scan either way.
         -- One array of ids (migration 47), not two of queue and key, which PostgreSQL 15
         -- costed as a descent per pair and scanned the whole table instead.
         WHERE b.id = ANY (ARRAY(SELECT x.bucket FROM candidate x WHERE x.rated))
           AND b.id = c.bucket
        RETURNING b.key
    ),
    -- shared: keyed_taken
    -- The slots given to their candidates, each by its id (migration 47) with the job's new token.
    -- By id, not by the row's address (ctid) the claim locked: a free slot updated and committed
    -- after the statement's snapshot is locked in its new version, which the snapshot cannot see
    -- at the old address, and a limit of 2 then ran 3 jobs at once.
    taken AS (
        UPDATE leaseq.flow_slots s
           SET job_id = c.id, lease_token = leaseq.lease_token_next(c.lease_token, (SELECT leaseq.lease_epoch())), taken_at = claim_now
          FROM candidate c
         -- An array, not only a join: an index scan whatever the plan. One array of ids, not
         -- three of queue, key and number: PostgreSQL 15's generic plan costed those as a
         -- descent per combination of their elements and scanned the whole table instead.
         WHERE s.id = ANY (ARRAY(SELECT x.slot FROM candidate x WHERE x.slot IS NOT NULL))
           AND s.id = c.slot
        RETURNING s.job_id
    ),
    -- end shared: keyed_taken
    -- shared: keyed_claimed
    -- The last step: the candidates leased, each the moment its claim holds its unit.
    claimed AS (
        UPDATE leaseq.jobs j
           SET status = 'running',
               -- Whatever it waited for (ctx.wait_for) is over: it runs.
               waiting_for = NULL, waiting_since = NULL,
               attempt_count = j.attempt_count + 1,
               lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
               lease_owner = lease_claim_keyed.holder,
               claim_id = lease_claim_keyed.claim_id,
               -- Only the lease's digest: sha256(the claim's secret || id) (leaseq.core.capability).
               lease_digest = sha256(lease_claim_keyed.claim_secret || int8send(j.id)),
               -- The moment the claim holds its unit (its locks are taken before any row is
               -- updated), not the transaction's start: the attempts of one key never overlap
               -- beyond its limit, even for a claim that started before the unit was given back.
               started_at = coalesce(claim_start, clock_timestamp()),
               heartbeat_at = claim_now,
               lease_expires_at = claim_now
                                  + least(make_interval(secs => lease_claim_keyed.lease_seconds),
                                          coalesce(j.timeout, make_interval(secs => lease_claim_keyed.lease_seconds)))
         WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
        RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
                  j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
                  extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
                  j.idempotency_key, j.checkpoint, j.trace_context
    )
    -- end shared: keyed_claimed
    SELECT claimed.* FROM claimed ORDER BY priority, available_at, id;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_claim_keyed(text[],text[],text,integer,double precision,uuid,bytea,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed_open(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, trace_context jsonb, limited boolean, rated boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed_open.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed_open.at IS NOT NULL THEN claim_now END;
BEGIN
    lease_claim_keyed_open.queues := leaseq.lease_queues(lease_claim_keyed_open.queues);
    RETURN QUERY
    WITH limited AS (
        SELECT EXISTS (SELECT 1 FROM leaseq.flow_limits l
                        WHERE l.queue = ANY (lease_claim_keyed_open.queues)
                          AND (l.max_running IS NOT NULL OR l.per_second IS NOT NULL)) AS yes
    ),
    candidate AS (
        SELECT c.id
          FROM unnest(lease_claim_keyed_open.queues) AS q(queue)
          CROSS JOIN LATERAL (
              SELECT j.id
                FROM leaseq.flow_keys k
                CROSS JOIN LATERAL (
                    SELECT j.id
                      FROM leaseq.jobs j
                     WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                       AND j.queue = k.queue AND j.key = k.key AND j.available_at <= claim_now
                       AND (lease_claim_keyed_open.job_types IS NULL OR j.job_type = ANY(lease_claim_keyed_open.job_types))
                     ORDER BY j.priority, j.available_at, j.id
                     LIMIT lease_claim_keyed_open.lim
                       FOR UPDATE SKIP LOCKED
                ) j
               WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
                 -- A key's own limit, read with this claim's snapshot as lease_claim_keyed reads it:
                 -- a limited key is never claimed here, whatever flow_limits showed.
                 AND k.max_running IS NULL AND NOT k.rated
                 AND (k.paused_until IS NULL OR k.paused_until <= claim_now)
               ORDER BY k.vtime, k.key
               LIMIT lease_claim_keyed_open.lim
          ) c
         WHERE NOT (SELECT l.yes FROM limited l)
         LIMIT lease_claim_keyed_open.lim
    ),
    -- shared: keyed_claimed
    claimed AS (
        UPDATE leaseq.jobs j
           SET status = 'running',
               -- Whatever it waited for (ctx.wait_for) is over: it runs.
               waiting_for = NULL, waiting_since = NULL,
               attempt_count = j.attempt_count + 1,
               lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
               lease_owner = lease_claim_keyed_open.holder,
               claim_id = lease_claim_keyed_open.claim_id,
               -- Only the lease's digest: sha256(the claim's secret || id) (leaseq.core.capability).
               lease_digest = sha256(lease_claim_keyed_open.claim_secret || int8send(j.id)),
               started_at = coalesce(claim_start, clock_timestamp()),
               heartbeat_at = claim_now,
               lease_expires_at = claim_now
                                  + least(make_interval(secs => lease_claim_keyed_open.lease_seconds),
                                          coalesce(j.timeout, make_interval(secs => lease_claim_keyed_open.lease_seconds)))
         WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
        RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
                  j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
                  extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
                  j.idempotency_key, j.checkpoint, j.trace_context
    )
    -- end shared: keyed_claimed
    SELECT claimed.*, l.yes AS limited,
           -- Looked for only where a limit is: an open queue pays nothing for it.
           l.yes AND
           -- shared: queues_rated
           EXISTS (SELECT 1 FROM leaseq.flow_limits r
                    WHERE r.queue = ANY (lease_claim_keyed_open.queues) AND r.per_second IS NOT NULL)
           -- end shared: queues_rated
           AS rated
      FROM limited l LEFT JOIN claimed ON true
     ORDER BY claimed.priority, claimed.available_at, claimed.id;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_claim_keyed_open(text[],text[],text,integer,double precision,uuid,bytea,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed_slots(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, trace_context jsonb, rated boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed_slots.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed_slots.at IS NOT NULL THEN claim_now END;
BEGIN
    lease_claim_keyed_slots.queues := leaseq.lease_queues(lease_claim_keyed_slots.queues);
    RETURN QUERY
    WITH rated AS (
        SELECT
        -- shared: queues_rated
        -- Whether one of the queues has a rate set: one probe of flow_limits_rated_idx
        -- (migration 27).
        EXISTS (SELECT 1 FROM leaseq.flow_limits r
                 WHERE r.queue = ANY (lease_claim_keyed_slots.queues) AND r.per_second IS NOT NULL)
        -- end shared: queues_rated
        AS yes
    ),
    candidate AS (
        SELECT c.id, c.queue, c.key, c.slot, c.lease_token
          FROM unnest(lease_claim_keyed_slots.queues) AS q(queue)
          CROSS JOIN LATERAL (
              SELECT k.queue, k.key, z.id, s.slots[z.n] AS slot, z.lease_token
                FROM leaseq.flow_keys k
                -- shared: keyed_slots
                CROSS JOIN LATERAL (
                    SELECT array_agg(x.id) AS slots FROM (
                        SELECT x.id FROM leaseq.flow_slots x
                         WHERE k.max_running IS NOT NULL
                           AND x.queue = k.queue AND x.key = k.key AND x.job_id IS NULL AND NOT x.retired
                         LIMIT lease_claim_keyed_slots.lim
                           FOR UPDATE SKIP LOCKED
                    ) x
                ) s
                -- end shared: keyed_slots
                -- The n-th job gets the n-th slot, and a limited key takes no more jobs than it
                -- locked slots. An unlimited key has no slots (NULL), and its jobs no slot.
                -- shared: keyed_ready
                CROSS JOIN LATERAL (
                    SELECT r.id, r.lease_token, row_number() OVER () AS n FROM (
                        SELECT j.id, j.lease_token
                          FROM leaseq.jobs j
                         WHERE j.status = 'pending' AND j.key IS NOT NULL AND NOT j.ordering_waiting
                           AND j.queue = k.queue AND j.key = k.key AND j.available_at <= claim_now
                           AND (lease_claim_keyed_slots.job_types IS NULL OR j.job_type = ANY(lease_claim_keyed_slots.job_types))
                         ORDER BY j.priority, j.available_at, j.id
                -- end shared: keyed_ready
                         LIMIT CASE WHEN k.max_running IS NULL THEN lease_claim_keyed_slots.lim
                                    ELSE coalesce(cardinality(s.slots), 0) END
                           FOR UPDATE SKIP LOCKED
                    ) r
                ) z
               WHERE k.queue = q.queue AND k.active AND k.next_at IS NULL
                 -- A key's rate, read with this claim's snapshot: a rated key is never claimed
                 -- here, whatever flow_limits showed.
                 AND NOT k.rated
                 AND (k.paused_until IS NULL OR k.paused_until <= claim_now)
                 AND (k.max_running IS NULL OR s.slots IS NOT NULL)
               ORDER BY k.vtime, k.key
               LIMIT lease_claim_keyed_slots.lim
          ) c
         WHERE NOT (SELECT r.yes FROM rated r)
         LIMIT lease_claim_keyed_slots.lim
    ),
    -- shared: keyed_taken
    taken AS (
        UPDATE leaseq.flow_slots s
           SET job_id = c.id, lease_token = leaseq.lease_token_next(c.lease_token, (SELECT leaseq.lease_epoch())), taken_at = claim_now
          FROM candidate c
         WHERE s.id = ANY (ARRAY(SELECT x.slot FROM candidate x WHERE x.slot IS NOT NULL))
           AND s.id = c.slot
        RETURNING s.job_id
    ),
    -- end shared: keyed_taken
    -- shared: keyed_claimed
    claimed AS (
        UPDATE leaseq.jobs j
           SET status = 'running',
               -- Whatever it waited for (ctx.wait_for) is over: it runs.
               waiting_for = NULL, waiting_since = NULL,
               attempt_count = j.attempt_count + 1,
               lease_token = leaseq.lease_token_next(j.lease_token, (SELECT leaseq.lease_epoch())),
               lease_owner = lease_claim_keyed_slots.holder,
               claim_id = lease_claim_keyed_slots.claim_id,
               -- Only the lease's digest: sha256(the claim's secret || id) (leaseq.core.capability).
               lease_digest = sha256(lease_claim_keyed_slots.claim_secret || int8send(j.id)),
               started_at = coalesce(claim_start, clock_timestamp()),
               heartbeat_at = claim_now,
               lease_expires_at = claim_now
                                  + least(make_interval(secs => lease_claim_keyed_slots.lease_seconds),
                                          coalesce(j.timeout, make_interval(secs => lease_claim_keyed_slots.lease_seconds)))
         WHERE j.id = ANY (ARRAY(SELECT candidate.id FROM candidate))
        RETURNING j.id, j.queue, j.job_type, j.payload, j.priority, j.available_at, j.attempt_count,
                  j.max_attempts, j.lease_token, j.lease_expires_at, j.started_at,
                  extract(epoch FROM j.timeout)::float8 AS timeout_seconds,
                  j.idempotency_key, j.checkpoint, j.trace_context
    )
    -- end shared: keyed_claimed
    SELECT claimed.*, r.yes AS rated
      FROM rated r LEFT JOIN claimed ON true
     ORDER BY claimed.priority, claimed.available_at, claimed.id;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_claim_keyed_slots(text[],text[],text,integer,double precision,uuid,bytea,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_spawn(job bigint, holder text, token bigint, secret bytea, name text, queues text[], job_types text[], payloads jsonb[], priorities smallint[], max_attempts integer[], run_ats timestamp with time zone[], delays double precision[], timeouts double precision[], idempotency_keys text[], deps_left integer[], has_children boolean[], keys text[], inherits boolean[], parents bigint[], children bigint[], afters text[], counted boolean[], at timestamp with time zone)
 RETURNS TABLE(pipeline_id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    spawner record;
    n integer := cardinality(lease_spawn.queues);
    ids bigint[];
    pipeline bigint;
    refused text;
BEGIN
    SELECT j.pipeline_id, j.key, j.enqueued_by, j.trace_context, leaseq.lease_now(lease_spawn.at) AS now
      INTO spawner
      FROM leaseq.jobs j
     WHERE j.id = lease_spawn.job AND j.lease_owner = lease_spawn.holder
       AND j.lease_token = lease_spawn.token AND j.status = 'running'
       AND j.lease_digest = sha256(lease_spawn.secret || int8send(j.id))
       AND j.lease_expires_at > leaseq.lease_now(lease_spawn.at);
    IF NOT FOUND OR n = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(lease_spawn.children) c WHERE c NOT BETWEEN -n AND -1)
       OR EXISTS (SELECT 1 FROM unnest(lease_spawn.parents) p WHERE p = 0 OR p < -n) THEN
        RAISE EXCEPTION 'a fan-out''s edges name its nodes as -1..-% and existing jobs by id', n
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'edges';
    END IF;
    SELECT q INTO refused FROM unnest(lease_spawn.queues) q
     WHERE NOT leaseq.queue_open_to(q, 'producer', spawner.enqueued_by) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'a fan-out of job % may not enqueue into queue %: the queue is given to other producer roles than its job''s producer', lease_spawn.job, refused
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    ids := ARRAY(SELECT nextval(pg_get_serial_sequence('leaseq.jobs', 'id'))
                   FROM generate_series(1, n));
    IF spawner.pipeline_id IS NULL THEN
        INSERT INTO leaseq.pipelines (name, total, created_at, created_by)
        VALUES (lease_spawn.name, n, spawner.now, spawner.enqueued_by)
        RETURNING leaseq.pipelines.id INTO pipeline;
    ELSE
        UPDATE leaseq.pipelines p SET total = p.total + n, finished_at = NULL
         WHERE p.id = spawner.pipeline_id;
        pipeline := spawner.pipeline_id;
    END IF;
    INSERT INTO leaseq.jobs (id, queue, job_type, payload, priority, max_attempts, available_at,
                             timeout, idempotency_key, created_at, status, deps_left,
                             has_children, pipeline_id, key, enqueued_by, trace_context)
    OVERRIDING SYSTEM VALUE
    SELECT ids[g.i], g.queue, g.job_type, g.payload, g.priority, g.max_attempts,
           coalesce(g.run_at, spawner.now + make_interval(secs => g.delay)),
           make_interval(secs => g.timeout), g.idempotency_key, spawner.now,
           CASE WHEN g.deps_left > 0 THEN 'waiting' ELSE 'pending' END::leaseq.job_status,
           g.deps_left, g.has_children, pipeline,
           CASE WHEN g.inherit THEN spawner.key ELSE g.key END, spawner.enqueued_by,
           spawner.trace_context
      FROM unnest(lease_spawn.queues, lease_spawn.job_types, lease_spawn.payloads,
                  lease_spawn.priorities, lease_spawn.max_attempts, lease_spawn.run_ats,
                  lease_spawn.delays, lease_spawn.timeouts, lease_spawn.idempotency_keys,
                  lease_spawn.deps_left, lease_spawn.has_children, lease_spawn.keys,
                  lease_spawn.inherits)
           WITH ORDINALITY AS g(queue, job_type, payload, priority, max_attempts, run_at,
                                delay, timeout, idempotency_key, deps_left, has_children,
                                key, inherit, i);
    INSERT INTO leaseq.job_deps (parent_id, child_id, after, counted)
    SELECT CASE WHEN e.parent < 0 THEN ids[-e.parent] ELSE e.parent END, ids[-e.child],
           e.after, e.counted
      FROM unnest(lease_spawn.parents, lease_spawn.children, lease_spawn.afters,
                  lease_spawn.counted) AS e(parent, child, after, counted);
    RETURN QUERY SELECT pipeline;
END
$function$
;
