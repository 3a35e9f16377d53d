-- leaseq's present tense: what each component's database role may do (docs/guides/security.md).
--
-- Covers: row level security on the tables that have policies, and leaseq.apply_grants, which
-- grants each component's role (worker, operator, producer) exactly its privileges and
-- policies. The console's role is console.sql's (apply_console_grants). Each function's
-- PUBLIC EXECUTE is decided next to its definition, in its own file.
-- Set off by: grants_apply in queries/migrations.sql, run by `leaseq migrate --worker-role ...
-- --operator-role ... --producer-role ...` after the migrations.

-- The owner bypasses these (no FORCE); any other role sees only what a policy lets it.
ALTER TABLE leaseq.jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.job_attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.job_results ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.job_deps ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.pipelines ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.schedules ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.workers ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.flow_slots ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.job_steps ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.job_stream ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.job_signals ENABLE ROW LEVEL SECURITY;

-- Bounds what one session of a component's role can hold up: a transaction left idle ends
-- after idle_in_transaction_session_timeout (60 s; its locks go with it), and a statement
-- that waits for a lock longer than lock_timeout (30 s) fails (a worker retries it) rather
-- than queueing every claim, renewal and reap behind it. Set on the role and on each login
-- that is a member of it (a role's settings apply only to sessions that log in as that
-- role), and only where that role has no setting of its own: an operator's ALTER ROLE
-- stands. Where the migrating role may not alter a role, says so in the returned line
-- (starting 'skipped') instead of failing the grants. Returns what it set or skipped.
CREATE OR REPLACE FUNCTION leaseq.role_limits(target regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    login regrole;
    setting record;
    stmt text;
BEGIN
    FOR login IN
        SELECT target
        UNION
        SELECT m.member::regrole FROM pg_auth_members m JOIN pg_roles p ON p.oid = m.member
         WHERE m.roleid = target AND p.rolcanlogin
    LOOP
        FOR setting IN
            SELECT * FROM (VALUES ('idle_in_transaction_session_timeout', '60s'),
                                  ('lock_timeout', '30s')) AS v(name, value)
             WHERE NOT EXISTS (
                SELECT 1 FROM pg_db_role_setting s, unnest(s.setconfig) c
                 WHERE s.setrole = login AND s.setdatabase = 0
                   AND split_part(c, '=', 1) = v.name)
        LOOP
            stmt := format('ALTER ROLE %s SET %s = %L', login, setting.name, setting.value);
            BEGIN
                EXECUTE stmt;
                RETURN NEXT stmt;
            EXCEPTION WHEN insufficient_privilege THEN
                RETURN NEXT format('skipped (%s may not alter role %s; set it yourself): %s',
                                   current_user, login, stmt);
            END;
        END LOOP;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.role_limits(regrole) FROM PUBLIC;

-- Grants each component's role exactly its privileges on leaseq's objects, and nothing more:
-- first everything is revoked from the previously registered roles and from the given ones,
-- and leaseq's policies are dropped; then each role gets its grants and policies. Idempotent,
-- one transaction. A NULL role leaves that component without a role. Returns every
-- statement it ran, in order. Only the owner of leaseq's tables may run it.
--
-- worker:   reads jobs, attempts, effects; claims a job (taking its key's units and rate
--           tokens), changes a running job, its attempt, effect, steps and stream, and reads
--           its signals, only through the worker's door (definitions/claims.sql and lease.sql:
--           EXECUTE on the lease_* functions; a claim mints the lease's secret, the rest
--           check it); writes the registry leaseq.workers; declares
--           its app's schedules at start-up (through schedule_put and schedule_retire: code
--           schedules of its own login only; reads the slot records); spawns from a handler
--           through lease_spawn_lock and lease_spawn in its completion's transaction (jobs,
--           edges and pipelines owned by the producer of the job it holds); reads the
--           flow tables; pauses only its own job's key, by a back-off (lease_back_off).
--           No DELETE on jobs or attempts (cannot prune), no DDL.
-- operator: reaps, cancels, retries dead jobs, prunes (deletes finished jobs, their attempts
--           and edges), reads stats, holds the leader lease, forgets stale workers;
--           runs the leader's history duties (reads and writes the history, the ledger, the
--           rules, the counts and the mover's state; deletes effects whose job's retention
--           ended; the partition functions); runs the scheduler (reads and writes schedules,
--           records slots, and enqueues only the jobs a slot fires: a restrictive policy
--           admits only a slot's idempotency key `schedule:<name>:<slot>`); sets limits,
--           repairs units, unblocks aggregates, pauses and resumes keys; settles uncertain steps; signals any job; on PostgreSQL >= 17 may VACUUM leaseq.jobs
--           and leaseq.flow_keys (MAINTAIN). Cannot change a job's queue, type, payload or
--           keys, nor insert other jobs or effects.
-- producer: enqueues (INSERT of the job's own columns only, keys and graphs included, always
--           unfinished) and reads the jobs it enqueued, their attempts, their effects,
--           their steps, streams and signals; flags (to be woken when they finish), marks as
--           parents and signals only its own jobs; cancels only its own jobs (with their
--           descendants of its own) and pipelines, through leaseq.producer_cancel and
--           leaseq.producer_cancel_pipeline; calls leaseq.enqueue, leaseq.job_status,
--           leaseq.stream_read and leaseq.signal. Nothing else.
CREATE OR REPLACE FUNCTION leaseq.apply_grants(worker regrole, operator regrole, producer regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
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
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants(regrole, regrole, regrole) FROM PUBLIC;
