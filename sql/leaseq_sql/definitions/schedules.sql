-- leaseq's present tense: declaring schedules.
--
-- Covers: leaseq.schedule_put and leaseq.schedule_retire, the one way a schedule is declared
-- (SECURITY DEFINER: the worker's role has no INSERT or UPDATE on leaseq.schedules). Set off
-- by: schedule_put and schedule_disable_undeclared in queries/schedules.sql (a worker's
-- start-up declares its app's code schedules; `leaseq schedules add` a run-time one).
--
-- A worker's login declares only code schedules, and changes only those its own login (or a
-- role it is a member of) declared: never a run-time schedule, another login's, a pause or a
-- slot. Only a role that may write leaseq.schedules itself (the operator's, the owner)
-- declares run-time schedules. A schedule's job is checked as an enqueue is (queue name, job
-- type, payload of at most 1,048,576 bytes as JSON, 1-1,000 attempts).

-- Creates a schedule or updates the one of the same origin (a new cron, zone or a re-enable
-- moves fire_after to `at`; paused is kept); no row when the name belongs to the other origin
-- or to another login's code.
CREATE OR REPLACE FUNCTION leaseq.schedule_put(
    name text, cron text, timezone text, queue text, job_type text, payload jsonb,
    priority integer, max_attempts integer, overlap leaseq.schedule_overlap,
    catchup_seconds double precision, declared_by leaseq.schedule_origin, declared_in text,
    at timestamptz
) RETURNS TABLE (schedule text, created boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
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
    IF NOT has_table_privilege(session_user, 'leaseq.schedules', 'UPDATE')
       AND NOT leaseq.queue_open_to(schedule_put.queue, 'worker', session_user) THEN
        RAISE EXCEPTION 'role % may not declare a schedule into queue %: the queue is given to other worker roles (`leaseq queues show`)', session_user, schedule_put.queue
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
$fn$;

-- Disables (never deletes) the enabled code schedules of an app that its registry no longer
-- declares, of the caller's own login (or a role it is a member of); returns their names.
CREATE OR REPLACE FUNCTION leaseq.schedule_retire(app text, names text[], at timestamptz)
RETURNS SETOF text
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE leaseq.schedules s
       SET enabled = false, disabled_reason = 'no longer declared by ' || app, updated_at = at
     WHERE s.declared_by = 'code' AND s.declared_in = app AND s.enabled
       AND NOT (s.name = ANY(names))
       AND EXISTS (SELECT 1 FROM pg_roles r
                    WHERE r.rolname = s.declared_role AND pg_has_role(session_user, r.oid, 'MEMBER'))
    RETURNING s.name
$$;

REVOKE ALL ON FUNCTION leaseq.schedule_put(text, text, text, text, text, jsonb, integer, integer,
    leaseq.schedule_overlap, double precision, leaseq.schedule_origin, text, timestamptz),
    leaseq.schedule_retire(text, text[], timestamptz) FROM PUBLIC;
