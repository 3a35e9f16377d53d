-- Component roles for the schedules (migration 8): leaseq.apply_grants() of version 9 does
-- everything it did, then:
-- worker:   declares its app's schedules at start-up: reads and upserts leaseq.schedules
--           (never deletes one) and reads the slot records.
-- operator: runs the scheduler tick and `leaseq schedules add/pause/resume/remove`: reads and
--           writes leaseq.schedules, records slots, and enqueues exactly the jobs a slot
--           fires. The operator may still not enqueue anything else: a restrictive policy
--           admits only rows whose idempotency key is a slot's (`schedule:<name>:<slot>`),
--           and the column grant only the columns a slot's job sets (its id comes from the
--           jobs' sequence, so the slot row can name it in the same statement).
-- Nothing new for producers.
ALTER FUNCTION leaseq.apply_grants(regrole, regrole, regrole) RENAME TO apply_grants_v9;

CREATE FUNCTION leaseq.apply_grants(worker regrole, operator regrole, producer regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    stmt text;
    stmts text[] := ARRAY[]::text[];
BEGIN
    -- Version 9 revokes every table and sequence privilege and drops every leaseq_ policy of
    -- the old and given roles first, so what follows starts from nothing.
    RETURN QUERY SELECT s FROM leaseq.apply_grants_v9(worker, operator, producer) s;
    IF worker IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT, INSERT, UPDATE ON leaseq.schedules TO %s', worker),
            format('GRANT SELECT ON leaseq.schedule_slots TO %s', worker)];
    END IF;
    IF operator IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT, INSERT, UPDATE, DELETE ON leaseq.schedules TO %s', operator),
            format('GRANT SELECT, INSERT ON leaseq.schedule_slots TO %s', operator),
            format('GRANT INSERT (id, queue, job_type, payload, priority, max_attempts, available_at, idempotency_key, created_at) ON leaseq.jobs TO %s', operator),
            format('GRANT USAGE ON SEQUENCE %s TO %s', pg_get_serial_sequence('leaseq.jobs', 'id'), operator),
            format('CREATE POLICY leaseq_operator_slot_jobs ON leaseq.jobs AS RESTRICTIVE FOR INSERT TO %s WITH CHECK (starts_with(idempotency_key, ''schedule:''))', operator)];
    END IF;
    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants(regrole, regrole, regrole) FROM PUBLIC;
