-- leaseq schema, version 3: least privilege and bounded names.
--
-- 1. Queue names: 1-128 characters of [A-Za-z0-9._:-], starting with a letter or digit, so a
--    name is safe in a metric label, a log line, a terminal table and a Kubernetes spec.
-- 2. Effect keys are scoped to (queue, job_type): a job can only find its effect key taken by
--    an earlier job of the same queue and type, never by another queue's or type's job.
-- 3. Who enqueued a job (enqueued_by = the database user), so a producer role reads only the
--    jobs it enqueued.
-- 4. Row-level security on the job tables, and leaseq.apply_grants(), which grants each
--    component's database role exactly what that component's statements need (run by
--    `leaseq migrate --worker-role ... --operator-role ... --producer-role ...`).
--    The schema owner (the role that runs migrate) is not subject to the policies.

DO $$
DECLARE
    bad bigint;
BEGIN
    SELECT count(DISTINCT queue) INTO bad FROM leaseq.jobs
     WHERE queue !~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$';
    IF bad > 0 THEN
        RAISE EXCEPTION 'leaseq migration 3: % queue name(s) in leaseq.jobs are outside [A-Za-z0-9._:-] (1-128 characters, first a letter or digit)', bad
            USING HINT = 'finish, cancel and prune or rename those jobs (SELECT DISTINCT queue FROM leaseq.jobs), then migrate again; nothing was changed';
    END IF;
END
$$;

ALTER TABLE leaseq.jobs DROP CONSTRAINT jobs_queue_name;
ALTER TABLE leaseq.jobs ADD CONSTRAINT jobs_queue_name
    CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$');

-- The database user that enqueued the job; rows from before this migration name the user
-- that ran it. Producers cannot set it (no column privilege): the default always applies.
ALTER TABLE leaseq.jobs ADD COLUMN enqueued_by text NOT NULL DEFAULT current_user;

-- Effect keys per (queue, job_type). Effects whose job was already pruned keep an empty
-- scope: they no longer guard anything, as no job can reach them.
ALTER TABLE leaseq.job_results ADD COLUMN queue text NOT NULL DEFAULT '';
ALTER TABLE leaseq.job_results ADD COLUMN job_type text NOT NULL DEFAULT '';
UPDATE leaseq.job_results r SET queue = j.queue, job_type = j.job_type
  FROM leaseq.jobs j WHERE j.id = r.job_id;
ALTER TABLE leaseq.job_results ALTER COLUMN queue DROP DEFAULT;
ALTER TABLE leaseq.job_results ALTER COLUMN job_type DROP DEFAULT;
ALTER TABLE leaseq.job_results DROP CONSTRAINT job_results_pkey;
ALTER TABLE leaseq.job_results ADD CONSTRAINT job_results_pkey
    PRIMARY KEY (queue, job_type, idempotency_key);

-- Views run with the privileges of their owner, which would bypass the policies below.
ALTER VIEW leaseq.job_view SET (security_invoker = true);

-- The owner bypasses these (no FORCE); any other role sees only what a policy lets it.
ALTER TABLE leaseq.jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.job_attempts ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaseq.job_results ENABLE ROW LEVEL SECURITY;

-- Which role each component runs as, as last applied by leaseq.apply_grants().
CREATE TABLE leaseq.component_roles (
    component text PRIMARY KEY CHECK (component IN ('worker', 'operator', 'producer')),
    role_oid  oid NOT NULL UNIQUE
);

-- Grants each component's role exactly its privileges on leaseq's objects, and nothing more:
-- first everything is revoked from the previously registered roles and from the given ones,
-- and leaseq's policies are dropped; then each role gets its grants and policies. Idempotent,
-- one transaction. A NULL role leaves that component without a role. Returns every
-- statement it ran, in order. Only the owner of leaseq's tables may run it.
--
-- worker:   reads jobs, attempts, effects; updates only unfinished jobs (pending, running)
--           and only the lease, progress, outcome columns; records attempts (and may turn a
--           lease_expired/cancelled attempt into fenced); inserts effects; writes the
--           registry leaseq.workers. No DELETE on jobs or attempts (cannot prune), no DDL.
-- operator: reaps, cancels, retries dead jobs, prunes (deletes finished jobs and their
--           attempts), reads stats, holds the leader lease, forgets stale workers, and on
--           PostgreSQL >= 17 may VACUUM leaseq.jobs (MAINTAIN). Cannot change a job's queue,
--           type, payload or keys, nor insert jobs or effects.
-- producer: enqueues (INSERT of the job's own columns only) and reads the jobs it enqueued,
--           their attempts and their effects. Nothing else.
CREATE FUNCTION leaseq.apply_grants(worker regrole, operator regrole, producer regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    owner_oid oid := (SELECT relowner FROM pg_class WHERE oid = 'leaseq.jobs'::regclass);
    given regrole[] := ARRAY[worker, operator, producer];
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
    FOR r IN
        SELECT DISTINCT x FROM (
            SELECT c.role_oid::regrole AS x FROM leaseq.component_roles c
             WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid)
            UNION ALL SELECT g FROM unnest(given) g WHERE g IS NOT NULL
        ) s
    LOOP
        stmts := stmts || ARRAY[
            format('REVOKE ALL ON ALL TABLES IN SCHEMA leaseq FROM %s', r),
            format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA leaseq FROM %s', r),
            format('REVOKE ALL ON SCHEMA leaseq FROM %s', r)];
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
            format('GRANT UPDATE (status, attempt_count, lease_token, lease_owner, started_at, heartbeat_at, lease_expires_at, progress, checkpoint, claim_id, finished_at, result, available_at, last_error, last_error_code) ON leaseq.jobs TO %s', worker),
            format('GRANT INSERT ON leaseq.job_attempts, leaseq.job_results TO %s', worker),
            format('GRANT UPDATE (outcome, ended_at, error) ON leaseq.job_attempts TO %s', worker),
            -- The registry is the workers' own table: whatever a worker reports about itself.
            format('GRANT INSERT, UPDATE, DELETE ON leaseq.workers TO %s', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.jobs FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_unfinished ON leaseq.jobs FOR UPDATE TO %s USING (status IN (''pending'', ''running'')) WITH CHECK (true)', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_attempts FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_record ON leaseq.job_attempts FOR INSERT TO %s WITH CHECK (true)', worker),
            format('CREATE POLICY leaseq_worker_fence ON leaseq.job_attempts FOR UPDATE TO %s USING (outcome IN (''lease_expired'', ''cancelled'')) WITH CHECK (outcome = ''fenced'')', worker),
            format('CREATE POLICY leaseq_worker_read ON leaseq.job_results FOR SELECT TO %s USING (true)', worker),
            format('CREATE POLICY leaseq_worker_effect ON leaseq.job_results FOR INSERT TO %s WITH CHECK (true)', worker)];
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
            format('GRANT INSERT, UPDATE, DELETE ON leaseq.leader_leases TO %s', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.jobs FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('CREATE POLICY leaseq_operator_all ON leaseq.job_attempts FOR ALL TO %s USING (true) WITH CHECK (true)', operator),
            format('CREATE POLICY leaseq_operator_read ON leaseq.job_results FOR SELECT TO %s USING (true)', operator)];
        IF current_setting('server_version_num')::int >= 170000 THEN
            stmts := stmts || format('GRANT MAINTAIN ON leaseq.jobs TO %s', operator);
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
            format('CREATE POLICY leaseq_producer_own ON leaseq.job_results FOR SELECT TO %s USING (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_id))', producer)];
        INSERT INTO leaseq.component_roles VALUES ('producer', producer);
    END IF;

    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants(regrole, regrole, regrole) FROM PUBLIC;
