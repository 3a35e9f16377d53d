-- leaseq schema: a lease is a capability, and the worker role writes only through its door
-- (issue 59).
--
-- The fencing token orders executions but proves nothing: every worker login reads every
-- job's token, and a worker login wrote leaseq.job_steps, job_stream, job_attempts and
-- job_results and updated a running job with nothing else (worker A forged worker B's
-- recorded steps, stream items, attempt rows and completion). It also claimed by its own
-- UPDATE (a trigger checked token and status, not the lease it wrote, so a claim could give
-- itself an endless lease) and wrote flow_slots and flow_buckets (a unit taken for a job
-- that does not exist, a bucket refilled).
--
-- * Each claim writes jobs.lease_digest = sha256(the claim's secret || id); only the claimer
--   holds the secret (leaseq.core.capability). The digest is NULL on rows claimed before
--   this migration: a worker of this version never holds one.
-- * The claims (definitions/claims.sql) and everything a running attempt changes
--   (definitions/lease.sql) are SECURITY DEFINER functions, one statement each, checking the
--   secret next to owner, token and expiry, in database time (a caller's `now` is honoured
--   only for the owner's logins: leaseq.lease_now, inlined). The worker role keeps SELECT
--   on those tables (not on job_signals) and UPDATE of jobs.has_children only; the fence
--   trigger, with nothing left to fence, is dropped with its function. A time a job is
--   handed back until is bounded as the trigger bounded it.
-- * The door holds the API's bounds (22023 with the field in COLUMN, leaseq.InvalidJob): a
--   step result, result or checkpoint over 1,048,576 bytes as JSON, a stream item or
--   progress over 65,536, a step name outside 1-200 characters, a job's 10,001st step.
-- * A job joins only a pipeline of its own producer (restrictive policies for the producer
--   and a worker's fan-out), and no worker marks a pipeline finished.
-- * A worker pauses only its own job's key, by a back-off (lease_back_off): flow_pause is
--   the operator role's now.
--
-- The policies and grants come with apply_grants; `leaseq migrate` run without roles grants
-- the roles registered by the last run their new rights (grants_reapply).

ALTER TABLE leaseq.jobs ADD COLUMN lease_digest bytea;

-- The worker role's fence trigger goes with its function: a worker login updates no column
-- of leaseq.jobs but has_children, so there is nothing left for it to fence.
DROP TRIGGER IF EXISTS leaseq_worker_fence ON leaseq.jobs;

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
    producer_functions text := 'leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean), leaseq.job_status(bigint), leaseq.stream_read(bigint, bigint, integer), leaseq.producer_cancel(bigint, text), leaseq.producer_cancel_pipeline(bigint, text)';
    signal_function text := 'leaseq.signal(bigint, text, jsonb)';
    history_functions text := 'leaseq.history_ensure_partitions(integer, timestamptz), leaseq.history_expire_step(timestamptz, integer)';
    flow_functions text := 'leaseq.flow_limit_set(text, text, integer, double precision, double precision, double precision, boolean), leaseq.flow_unblock(text, text), leaseq.flow_repair(integer), leaseq.flow_settle(integer, double precision), leaseq.flow_resume(text, text), leaseq.flow_pause(text, text, timestamptz)';
    schedule_functions text := 'leaseq.schedule_put(text, text, text, text, text, jsonb, integer, integer, leaseq.schedule_overlap, double precision, leaseq.schedule_origin, text, timestamptz), leaseq.schedule_retire(text, text[], timestamptz)';
    lease_functions text := 'leaseq.lease_claim(text[], text[], text, integer, double precision, uuid, bytea, timestamptz), leaseq.lease_claim_keyed(text[], text[], text, integer, double precision, uuid, bytea, timestamptz), leaseq.lease_claim_keyed_slots(text[], text[], text, integer, double precision, uuid, bytea, timestamptz), leaseq.lease_claim_keyed_open(text[], text[], text, integer, double precision, uuid, bytea, timestamptz), leaseq.lease_heartbeat_many(bigint[], text[], bigint[], bytea[], jsonb[], double precision, timestamptz), leaseq.lease_checkpoint(bigint, text, bigint, bytea, jsonb, timestamptz), leaseq.lease_complete(bigint[], text[], bigint[], bytea[], jsonb[], text[], jsonb[], text[], timestamptz), leaseq.lease_fail(bigint, text, bigint, bytea, text, text, text, boolean, leaseq.attempt_outcome, double precision, double precision, timestamptz), leaseq.lease_release(bigint, text, bigint, bytea, timestamptz, text, boolean, double precision, double precision, timestamptz), leaseq.lease_back_off(bigint, text, bigint, bytea, timestamptz, double precision, text, timestamptz), leaseq.lease_sleep(bigint, text, bigint, bytea, timestamptz, timestamptz, timestamptz), leaseq.lease_wait(bigint, text, bigint, bytea, timestamptz, text, timestamptz, timestamptz), leaseq.lease_refused(bigint, text, bigint, bytea, integer, timestamptz, text, timestamptz), leaseq.lease_step_intend(bigint, text, bigint, bytea, text, bigint, timestamptz), leaseq.lease_step_record(bigint, text, bigint, bytea, text, jsonb, text, timestamptz), leaseq.lease_step_withdraw(bigint, text, bigint, bytea, text, timestamptz), leaseq.lease_emit(bigint, text, bigint, bytea, jsonb, integer, timestamptz), leaseq.lease_signal(bigint, text, bigint, bytea, text, timestamptz)';
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
            -- Only has_children (a fan-out's parent mark) is the worker's to update.
            format('CREATE POLICY leaseq_worker_unfinished ON leaseq.jobs FOR UPDATE TO %s USING (status IN (''pending'', ''running'')) WITH CHECK (true)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_attempts FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_results FOR SELECT TO %s USING (true)', worker),
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
            -- ... owned by the producer of a job that runs under an unexpired lease (the
            -- spawner: a completion writes its fan-out before it ends the spawner's attempt),
            -- so a handler cannot make its jobs visible to a producer none of whose jobs it
            -- could hold. An uncorrelated IN: one scan of the running jobs' partial index per
            -- statement (a hashed subplan), however many jobs the fan-out inserts.
            format('CREATE POLICY leaseq_worker_spawner ON leaseq.jobs AS RESTRICTIVE FOR INSERT TO %s WITH CHECK (enqueued_by IN (SELECT h.enqueued_by FROM leaseq.jobs h WHERE h.status = ''running'' AND h.lease_expires_at > now()))', worker),
            -- ... into a pipeline of that same producer: no job joins another's pipeline.
            format('CREATE POLICY leaseq_worker_pipeline ON leaseq.jobs AS RESTRICTIVE FOR INSERT TO %s WITH CHECK (EXISTS (SELECT 1 FROM leaseq.pipelines p WHERE p.id = jobs.pipeline_id AND p.created_by = jobs.enqueued_by))', worker),
            -- A fan-out grows its pipeline (and so reopens it); it never finishes one: that
            -- is the status trigger's, as the owner.
            format('CREATE POLICY leaseq_worker_grow ON leaseq.pipelines AS RESTRICTIVE FOR UPDATE TO %s USING (true) WITH CHECK (finished_at IS NULL)', worker),
            format('CREATE POLICY leaseq_worker_spawner ON leaseq.pipelines AS RESTRICTIVE FOR INSERT TO %s WITH CHECK (created_by IN (SELECT h.enqueued_by FROM leaseq.jobs h WHERE h.status = ''running'' AND h.lease_expires_at > now()))', worker),
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
            format('GRANT INSERT (queue, job_type, payload, priority, max_attempts, available_at, timeout, idempotency_key, dedup_key, created_at) ON leaseq.jobs TO %s', producer),
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
END
$function$
;

DROP FUNCTION leaseq.jobs_worker_fence();

CREATE OR REPLACE FUNCTION leaseq.lease_oversized(field text, size integer, lim integer)
 RETURNS jsonb
 LANGUAGE plpgsql
 IMMUTABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    RAISE EXCEPTION 'invalid %: is % bytes as JSON; the limit is %; nothing was written', field, size, lim
        USING ERRCODE = 'invalid_parameter_value', COLUMN = field,
              DETAIL = format('is %s bytes as JSON; the limit is %s', size, lim);
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_oversized(text,integer,integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_bounded(field text, value jsonb, lim integer)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT CASE WHEN pg_catalog.octet_length(value::text) > lim
                THEN leaseq.lease_oversized(field, pg_catalog.octet_length(value::text), lim)
                ELSE value END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_bounded(text,jsonb,integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_owner_session()
 RETURNS boolean
 LANGUAGE sql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
    SELECT pg_has_role(session_user,
                       (SELECT c.relowner FROM pg_class c WHERE c.oid = 'leaseq.jobs'::regclass),
                       'USAGE')
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_owner_session() FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_now(at timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN at IS NULL THEN pg_catalog.now()
                WHEN leaseq.lease_owner_session() THEN at
                ELSE pg_catalog.now() END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_now(timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_back_off(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, seconds double precision, reason text, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone, paused_until timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_back_off.at) AS now),
    released AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = greatest(j.available_at, leaseq.lease_run_at(t.now + make_interval(secs => lease_back_off.seconds))),
               attempt_count = j.attempt_count - 1,
               last_error = lease_back_off.reason, last_error_code = 'BACK_OFF',
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         -- No status: a lease exists only while a job runs (jobs_lease_only_while_running), and
         -- naming status = 'running' lets the planner pick jobs_running_idx over the primary
         -- key when the statistics predate the running jobs (test_fenced_plans.py).
         WHERE j.id = lease_back_off.job AND j.lease_owner = lease_back_off.holder
           AND j.lease_token = lease_back_off.token AND j.lease_digest = sha256(lease_back_off.secret || int8send(j.id))
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.key, j.available_at, j.attempt_count + 1 AS attempt
    ),
    paused AS (
        SELECT leaseq.flow_pause(r.queue, r.key, r.available_at) AS until
          FROM released r WHERE r.key IS NOT NULL
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT r.id, r.attempt, lease_back_off.token, lease_back_off.holder, lease_back_off.started,
               t.now, 'released', lease_back_off.reason
          FROM released r, t
    )
    SELECT r.id, 'pending'::text, r.available_at, (SELECT max(p.until) FROM paused p)
      FROM released r;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_back_off(bigint,text,bigint,bytea,timestamp with time zone,double precision,text,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_checkpoint(job bigint, holder text, token bigint, secret bytea, state jsonb, at timestamp with time zone)
 RETURNS TABLE(id bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET checkpoint = leaseq.lease_bounded('checkpoint', lease_checkpoint.state, 1048576)
     WHERE j.id = lease_checkpoint.job AND j.lease_owner = lease_checkpoint.holder
       AND j.lease_token = lease_checkpoint.token AND j.lease_digest = sha256(lease_checkpoint.secret || int8send(j.id))
       AND j.lease_expires_at > leaseq.lease_now(lease_checkpoint.at)
    RETURNING j.id;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_checkpoint(bigint,text,bigint,bytea,jsonb,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_claim(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim.at);
    claim_start timestamptz := CASE WHEN lease_claim.at IS NOT NULL THEN claim_now END;
BEGIN
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
                  j.idempotency_key, j.checkpoint
    )
    SELECT * FROM claimed ORDER BY priority, available_at, id;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_claim(text[],text[],text,integer,double precision,uuid,bytea,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed.at IS NOT NULL THEN claim_now END;
BEGIN
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
                  j.idempotency_key, j.checkpoint
    )
    -- end shared: keyed_claimed
    SELECT claimed.* FROM claimed ORDER BY priority, available_at, id;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_claim_keyed(text[],text[],text,integer,double precision,uuid,bytea,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_claim_keyed_open(queues text[], job_types text[], holder text, lim integer, lease_seconds double precision, claim_id uuid, claim_secret bytea, at timestamp with time zone)
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, limited boolean, rated boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed_open.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed_open.at IS NOT NULL THEN claim_now END;
BEGIN
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
                  j.idempotency_key, j.checkpoint
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
 RETURNS TABLE(id bigint, queue text, job_type text, payload jsonb, priority smallint, available_at timestamp with time zone, attempt_count integer, max_attempts integer, lease_token bigint, lease_expires_at timestamp with time zone, started_at timestamp with time zone, timeout_seconds double precision, idempotency_key text, checkpoint jsonb, rated boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    claim_now timestamptz := leaseq.lease_now(lease_claim_keyed_slots.at);
    claim_start timestamptz := CASE WHEN lease_claim_keyed_slots.at IS NOT NULL THEN claim_now END;
BEGIN
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
                  j.idempotency_key, j.checkpoint
    )
    -- end shared: keyed_claimed
    SELECT claimed.*, r.yes AS rated
      FROM rated r LEFT JOIN claimed ON true
     ORDER BY claimed.priority, claimed.available_at, claimed.id;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_claim_keyed_slots(text[],text[],text,integer,double precision,uuid,bytea,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_complete(jobs bigint[], holders text[], tokens bigint[], secrets bytea[], results jsonb[], effect_keys text[], progresses jsonb[], notes text[], at timestamp with time zone)
 RETURNS TABLE(id bigint, effect_key text, effect_written boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_complete.at) AS now),
    req AS (
        SELECT r.id, r.holder, r.token, r.secret, r.result, r.effect_key, r.progress, r.note
          FROM unnest(lease_complete.jobs, lease_complete.holders, lease_complete.tokens,
                      lease_complete.secrets, lease_complete.results,
                      lease_complete.effect_keys, lease_complete.progresses,
                      lease_complete.notes)
               AS r(id, holder, token, secret, result, effect_key, progress, note)
    ),
    done AS (
        UPDATE leaseq.jobs j
           SET status = 'succeeded', finished_at = t.now, lease_expires_at = NULL,
               result = leaseq.lease_bounded('result', req.result, 1048576),
               progress = coalesce(leaseq.lease_bounded('progress', req.progress, 65536), j.progress)
          FROM t, req
         -- As in lease_heartbeat_many: the primary key whatever the plan.
         WHERE j.id = ANY (lease_complete.jobs)
           AND j.id = req.id AND j.lease_owner = req.holder
           AND j.lease_token = req.token AND j.lease_digest = sha256(req.secret || int8send(j.id))
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.job_type, j.attempt_count, j.lease_token, j.lease_owner,
                  j.started_at, j.finished_at,
                  coalesce(req.effect_key, j.idempotency_key) AS effect_key,
                  req.result, req.note
    ),
    effect AS (
        INSERT INTO leaseq.job_results (queue, job_type, idempotency_key, job_id, produced_by,
                                        produced_at, result)
        SELECT done.queue, done.job_type, done.effect_key, done.id, done.lease_owner,
               done.finished_at, coalesce(done.result, 'null'::jsonb)
          FROM done
         WHERE done.effect_key IS NOT NULL
        ON CONFLICT (queue, job_type, idempotency_key) DO NOTHING
        RETURNING job_id
    ),
    -- A key another job's effect holds drops this one: the attempt says so, so it is not silent.
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT done.id, done.attempt_count, done.lease_token, done.lease_owner, done.started_at,
               done.finished_at, 'succeeded',
               CASE WHEN done.effect_key IS NOT NULL
                     AND NOT EXISTS (SELECT 1 FROM effect e WHERE e.job_id = done.id)
                    THEN concat_ws('; ', done.note, 'effect not written: its key is held by another job''s effect (keys are per queue and job type, shared by every producer)')
                    ELSE done.note END
          FROM done
    )
    SELECT done.id, done.effect_key,
           EXISTS (SELECT 1 FROM effect e WHERE e.job_id = done.id) AS effect_written
      FROM done;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_complete(bigint[],text[],bigint[],bytea[],jsonb[],text[],jsonb[],text[],timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_emit(job bigint, holder text, token bigint, secret bytea, item jsonb, cap integer, at timestamp with time zone)
 RETURNS TABLE(held boolean, seq bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_emit.job AND j.lease_owner = lease_emit.holder
           AND j.lease_token = lease_emit.token AND j.lease_digest = sha256(lease_emit.secret || int8send(j.id))
           AND j.lease_expires_at > leaseq.lease_now(lease_emit.at)
           FOR SHARE OF j
    ),
    -- The last item by a backward scan of the primary key: one index entry, however long the
    -- stream (an aggregate over the join read every item of the job at each append).
    last AS (
        SELECT held.id,
               coalesce((SELECT s.seq FROM leaseq.job_stream s WHERE s.job_id = held.id
                          ORDER BY s.seq DESC LIMIT 1), 0) AS seq
          FROM held
    ),
    ins AS (
        INSERT INTO leaseq.job_stream (job_id, seq, value, at)
        SELECT last.id, last.seq + 1, leaseq.lease_bounded('stream item', lease_emit.item, 65536),
               leaseq.lease_now(lease_emit.at)
          FROM last WHERE last.seq < least(lease_emit.cap, 10000)
        RETURNING seq
    )
    SELECT EXISTS (SELECT 1 FROM held), (SELECT ins.seq FROM ins);
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_emit(bigint,text,bigint,bytea,jsonb,integer,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_fail(job bigint, holder text, token bigint, secret bytea, error text, error_code text, traceback text, retryable boolean, outcome leaseq.attempt_outcome, backoff_base double precision, backoff_cap double precision, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    IF lease_fail.outcome NOT IN ('failed', 'timed_out') THEN
        RAISE EXCEPTION 'a failed attempt''s outcome is failed or timed_out, got %; nothing was written', lease_fail.outcome
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_fail.at) AS now),
    failed AS (
        UPDATE leaseq.jobs j
           SET status = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                             THEN 'pending' ELSE 'dead' END::leaseq.job_status,
               available_at = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                   THEN leaseq.lease_run_at(t.now + leaseq.retry_delay(j.attempt_count, lease_fail.backoff_base, lease_fail.backoff_cap))
                                   ELSE j.available_at END,
               finished_at = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                  THEN NULL ELSE t.now END,
               lease_owner = CASE WHEN lease_fail.retryable AND j.attempt_count < j.max_attempts
                                  THEN NULL ELSE j.lease_owner END,
               lease_expires_at = NULL,
               last_error = lease_fail.error,
               last_error_code = lease_fail.error_code
          FROM t
         WHERE j.id = lease_fail.job AND j.lease_owner = lease_fail.holder
           AND j.lease_token = lease_fail.token AND j.lease_digest = sha256(lease_fail.secret || int8send(j.id))
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.status, j.available_at, j.attempt_count, j.lease_token, j.started_at
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error,
                                         traceback)
        SELECT failed.id, failed.attempt_count, failed.lease_token, lease_fail.holder,
               failed.started_at, t.now, lease_fail.outcome, lease_fail.error, lease_fail.traceback
          FROM failed, t
    )
    SELECT failed.id, failed.status::text, failed.available_at FROM failed;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_fail(bigint,text,bigint,bytea,text,text,text,boolean,leaseq.attempt_outcome,double precision,double precision,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_heartbeat_many(jobs bigint[], holders text[], tokens bigint[], secrets bytea[], progresses jsonb[], lease_seconds double precision, at timestamp with time zone)
 RETURNS TABLE(id bigint, lease_expires_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE leaseq.jobs j
       SET heartbeat_at = t.now,
           lease_expires_at = least(t.now + make_interval(secs => lease_heartbeat_many.lease_seconds),
                                    coalesce(j.started_at + least(j.timeout, interval '100 years'), 'infinity')),
           progress = coalesce(leaseq.lease_bounded('progress', r.progress, 65536), j.progress)
      FROM (SELECT leaseq.lease_now(lease_heartbeat_many.at) AS now) t,
           unnest(lease_heartbeat_many.jobs, lease_heartbeat_many.holders,
                  lease_heartbeat_many.tokens, lease_heartbeat_many.secrets,
                  lease_heartbeat_many.progresses) AS r(id, holder, token, secret, progress)
     -- The ids as an array too: a probe of the primary key whatever the plan (joined only, a
     -- small table's generic plan hashed a scan of all of it).
     WHERE j.id = ANY (lease_heartbeat_many.jobs)
       AND j.id = r.id AND j.lease_owner = r.holder AND j.lease_token = r.token
       AND j.lease_digest = sha256(r.secret || int8send(j.id))
       AND j.lease_expires_at > t.now
    RETURNING j.id, j.lease_expires_at;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_heartbeat_many(bigint[],text[],bigint[],bytea[],jsonb[],double precision,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_refused(job bigint, holder text, token bigint, secret bytea, attempt integer, started timestamp with time zone, call text, at timestamp with time zone)
 RETURNS TABLE(status leaseq.job_status, recorded bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH job AS (
        SELECT j.id, j.status, j.lease_token, j.lease_expires_at,
               coalesce(j.lease_digest = sha256(lease_refused.secret || int8send(j.id)), false) AS proven
          FROM leaseq.jobs j WHERE j.id = lease_refused.job
    ),
    refusal AS (
        SELECT job.id, t.at,
               lease_refused.call || ' refused: ' ||
               CASE WHEN job.status = 'running' AND job.lease_token = lease_refused.token
                    THEN 'the lease of token ' || job.lease_token || ' expired at '
                         || job.lease_expires_at || ' (job is running, not reaped yet)'
                    ELSE 'lease token ' || lease_refused.token || ' is not current (job is '
                         || job.status || ', token ' || job.lease_token || ')'
               END AS error
          FROM job, (SELECT leaseq.lease_now(lease_refused.at) AS at) t
         WHERE job.proven OR job.lease_token <> lease_refused.token
    ),
    -- A plain UPDATE, not ON CONFLICT DO UPDATE: an attempt that is not lease_expired is
    -- skipped here. A cancelled attempt stays cancelled: its worker hearing so is the
    -- cancellation working, not a fault. The attempt ended when the reaper took it: its end
    -- time stays (a later one would show the attempt holding its key's unit after the reaper
    -- gave it back); the error says when the call came.
    refenced AS (
        UPDATE leaseq.job_attempts a
           SET outcome = 'fenced',
               error = refusal.error || ' at ' || refusal.at || ' after ' || a.outcome::text
          FROM refusal
         WHERE a.job_id = refusal.id AND a.lease_token = lease_refused.token
           AND a.outcome = 'lease_expired'
        RETURNING a.job_id
    ),
    inserted AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT refusal.id, lease_refused.attempt, lease_refused.token, lease_refused.holder,
               lease_refused.started, refusal.at, 'fenced', refusal.error
          FROM refusal
        ON CONFLICT (job_id, lease_token) DO NOTHING
        RETURNING job_id
    )
    SELECT (SELECT job.status FROM job),
           (SELECT count(*) FROM refenced) + (SELECT count(*) FROM inserted);
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_refused(bigint,text,bigint,bytea,integer,timestamp with time zone,text,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_release(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, reason text, shutdown boolean, backoff_base double precision, backoff_cap double precision, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone, notified bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_release.at) AS now),
    released AS (
        UPDATE leaseq.jobs j
           SET status = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts
                             THEN 'dead' ELSE 'pending' END::leaseq.job_status,
               available_at = CASE WHEN lease_release.shutdown OR j.attempt_count >= j.max_attempts
                                   THEN j.available_at
                                   ELSE greatest(j.available_at,
                                                 leaseq.lease_run_at(t.now + leaseq.retry_delay(j.attempt_count, lease_release.backoff_base, lease_release.backoff_cap))) END,
               attempt_count = j.attempt_count - CASE WHEN lease_release.shutdown THEN 1 ELSE 0 END,
               finished_at = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts THEN t.now END,
               lease_owner = CASE WHEN NOT lease_release.shutdown AND j.attempt_count >= j.max_attempts THEN j.lease_owner END,
               last_error = CASE WHEN lease_release.shutdown THEN j.last_error ELSE lease_release.reason END,
               last_error_code = CASE WHEN lease_release.shutdown THEN j.last_error_code ELSE 'INTERRUPTED' END,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         WHERE j.id = lease_release.job AND j.lease_owner = lease_release.holder
           AND j.lease_token = lease_release.token AND j.lease_digest = sha256(lease_release.secret || int8send(j.id))
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.status, j.available_at,
                  j.attempt_count + CASE WHEN lease_release.shutdown THEN 1 ELSE 0 END AS attempt
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT released.id, released.attempt, lease_release.token, lease_release.holder,
               lease_release.started, t.now,
               CASE WHEN lease_release.shutdown THEN 'released' ELSE 'interrupted' END::leaseq.attempt_outcome,
               lease_release.reason
          FROM released, t
    ),
    woke AS (SELECT pg_notify('leaseq_jobs', released.queue) FROM released WHERE released.status = 'pending')
    SELECT released.id, released.status::text, released.available_at,
           (SELECT count(*) FROM woke)
      FROM released;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_release(bigint,text,bigint,bytea,timestamp with time zone,text,boolean,double precision,double precision,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_run_at(run_at timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
BEGIN
    IF NOT (isfinite(run_at) AND run_at <= now() + interval '3650 days') THEN
        RAISE EXCEPTION 'invalid run_at: must be a finite time within 3650 days of now, got %; nothing was written', run_at
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'run_at';
    END IF;
    RETURN run_at;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_run_at(timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_signal(job bigint, holder text, token bigint, secret bytea, signal_name text, at timestamp with time zone)
 RETURNS TABLE(found boolean, payload jsonb)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_signal.job AND j.lease_owner = lease_signal.holder
           AND j.lease_token = lease_signal.token AND j.lease_digest = sha256(lease_signal.secret || int8send(j.id))
           AND j.lease_expires_at > leaseq.lease_now(lease_signal.at)
    )
    SELECT s.job_id IS NOT NULL, s.payload
      FROM held
      LEFT JOIN leaseq.job_signals s ON s.job_id = held.id AND s.name = lease_signal.signal_name;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_signal(bigint,text,bigint,bytea,text,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_sleep(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, until_at timestamp with time zone, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_sleep.at) AS now),
    slept AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = greatest(t.now, leaseq.lease_run_at(lease_sleep.until_at)),
               attempt_count = j.attempt_count - 1,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t
         WHERE j.id = lease_sleep.job AND j.lease_owner = lease_sleep.holder
           AND j.lease_token = lease_sleep.token AND j.lease_digest = sha256(lease_sleep.secret || int8send(j.id))
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.available_at, j.attempt_count + 1 AS attempt
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT s.id, s.attempt, lease_sleep.token, lease_sleep.holder, lease_sleep.started, t.now,
               'released', 'sleeping until ' || s.available_at
          FROM slept s, t
    )
    SELECT s.id, 'pending'::text, s.available_at FROM slept s;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_sleep(bigint,text,bigint,bytea,timestamp with time zone,timestamp with time zone,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_step_intend(job bigint, holder text, token bigint, secret bytea, step text, seen_token bigint, at timestamp with time zone)
 RETURNS TABLE(intended_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    IF length(lease_step_intend.step) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'invalid step: must be a name of 1-200 characters; nothing was written'
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'step',
                  DETAIL = 'must be a name of 1-200 characters';
    END IF;
    IF (SELECT count(*) FROM (SELECT 1 FROM leaseq.job_steps s
                               WHERE s.job_id = lease_step_intend.job AND s.name <> lease_step_intend.step
                               LIMIT 10000) n) >= 10000 THEN
        RAISE EXCEPTION 'invalid step: job % has recorded 10000 steps, the most a job records; nothing was written', lease_step_intend.job
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'step',
                  DETAIL = 'the job has 10000 steps, the most a job records: group work into fewer steps';
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_step_intend.at) AS now),
    held AS (
        SELECT j.id, j.attempt_count, j.lease_token FROM leaseq.jobs j, t
         WHERE j.id = lease_step_intend.job AND j.lease_owner = lease_step_intend.holder
           AND j.lease_token = lease_step_intend.token
           AND j.lease_digest = sha256(lease_step_intend.secret || int8send(j.id))
           AND j.lease_expires_at > t.now
           FOR SHARE OF j
    )
    INSERT INTO leaseq.job_steps AS s (job_id, name, attempt, lease_token, intended_at)
    SELECT held.id, lease_step_intend.step, held.attempt_count, held.lease_token, t.now FROM held, t
    ON CONFLICT (job_id, name) DO UPDATE
       SET attempt = excluded.attempt, lease_token = excluded.lease_token,
           intended_at = excluded.intended_at
     WHERE s.finished_at IS NULL AND s.lease_token IS NOT DISTINCT FROM lease_step_intend.seen_token
    RETURNING s.intended_at;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_step_intend(bigint,text,bigint,bytea,text,bigint,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_step_record(job bigint, holder text, token bigint, secret bytea, step text, outcome jsonb, note text, at timestamp with time zone)
 RETURNS TABLE(finished_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_step_record.at) AS now),
    held AS (
        SELECT j.id FROM leaseq.jobs j, t
         WHERE j.id = lease_step_record.job AND j.lease_owner = lease_step_record.holder
           AND j.lease_token = lease_step_record.token
           AND j.lease_digest = sha256(lease_step_record.secret || int8send(j.id))
           AND j.lease_expires_at > t.now
           FOR SHARE OF j
    )
    UPDATE leaseq.job_steps s
       SET finished_at = t.now,
           result = leaseq.lease_bounded('step result', lease_step_record.outcome, 1048576),
           note = lease_step_record.note
      FROM held, t
     WHERE s.job_id = held.id AND s.name = lease_step_record.step
       AND s.lease_token = lease_step_record.token AND s.finished_at IS NULL
    RETURNING s.finished_at;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_step_record(bigint,text,bigint,bytea,text,jsonb,text,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_step_withdraw(job bigint, holder text, token bigint, secret bytea, step text, at timestamp with time zone)
 RETURNS TABLE(name text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH held AS (
        SELECT j.id FROM leaseq.jobs j
         WHERE j.id = lease_step_withdraw.job AND j.lease_owner = lease_step_withdraw.holder
           AND j.lease_token = lease_step_withdraw.token
           AND j.lease_digest = sha256(lease_step_withdraw.secret || int8send(j.id))
           AND j.lease_expires_at > leaseq.lease_now(lease_step_withdraw.at)
           FOR SHARE OF j
    )
    UPDATE leaseq.job_steps s
       SET attempt = NULL, lease_token = NULL, intended_at = NULL
      FROM held
     WHERE s.job_id = held.id AND s.name = lease_step_withdraw.step
       AND s.lease_token = lease_step_withdraw.token AND s.finished_at IS NULL
    RETURNING s.name;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_step_withdraw(bigint,text,bigint,bytea,text,timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION leaseq.lease_wait(job bigint, holder text, token bigint, secret bytea, started timestamp with time zone, signal_name text, until_at timestamp with time zone, at timestamp with time zone)
 RETURNS TABLE(id bigint, status text, available_at timestamp with time zone, signalled boolean, notified bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM FROM leaseq.jobs j
      WHERE j.id = lease_wait.job AND j.lease_owner = lease_wait.holder
        AND j.lease_token = lease_wait.token AND j.lease_digest = sha256(lease_wait.secret || int8send(j.id))
        AND j.lease_expires_at > leaseq.lease_now(lease_wait.at)
        FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH t AS (SELECT leaseq.lease_now(lease_wait.at) AS now),
    sent AS (
        SELECT EXISTS (SELECT 1 FROM leaseq.job_signals s
                        WHERE s.job_id = lease_wait.job AND s.name = lease_wait.signal_name) AS there
    ),
    waited AS (
        UPDATE leaseq.jobs j
           SET status = 'pending',
               available_at = CASE WHEN sent.there THEN t.now
                                   ELSE greatest(t.now, leaseq.lease_run_at(lease_wait.until_at)) END,
               waiting_for = lease_wait.signal_name, waiting_since = t.now,
               attempt_count = j.attempt_count - 1,
               lease_token = j.lease_token + 1, lease_expires_at = NULL,
               started_at = NULL, heartbeat_at = NULL
          FROM t, sent
         WHERE j.id = lease_wait.job AND j.lease_owner = lease_wait.holder
           AND j.lease_token = lease_wait.token AND j.lease_digest = sha256(lease_wait.secret || int8send(j.id))
           AND j.lease_expires_at > t.now
        RETURNING j.id, j.queue, j.available_at, j.attempt_count + 1 AS attempt, sent.there
    ),
    attempt AS (
        INSERT INTO leaseq.job_attempts (job_id, attempt, lease_token, worker, started_at, ended_at, outcome, error)
        SELECT w.id, w.attempt, lease_wait.token, lease_wait.holder, lease_wait.started, t.now,
               'released',
               CASE WHEN w.there THEN 'signal ' || quote_literal(lease_wait.signal_name) || ' arrived while handing back'
                    ELSE 'waiting for signal ' || quote_literal(lease_wait.signal_name) || ' until ' || w.available_at END
          FROM waited w, t
    ),
    -- The signal came first: claimable now, so say so.
    woke AS (SELECT pg_notify('leaseq_jobs', w.queue) FROM waited w WHERE w.there)
    SELECT w.id, 'pending'::text, w.available_at, w.there, (SELECT count(*) FROM woke)
      FROM waited w;
END
$function$
;
REVOKE ALL ON FUNCTION leaseq.lease_wait(bigint,text,bigint,bytea,timestamp with time zone,text,timestamp with time zone,timestamp with time zone) FROM PUBLIC;
