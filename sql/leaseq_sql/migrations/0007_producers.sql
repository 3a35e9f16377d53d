-- Producers: wait for results, and enqueue or read a job from any language.
--
-- 1. Waiters. A job somebody may wait for has a row in leaseq.job_waiters (inserted by
--    enqueue(wait=True) in the enqueue's transaction, or by a waiter after it LISTENs and
--    before it reads the job). When a job reaches a final status, in the transaction that
--    finishes it and whichever statement does it (complete, fail, release, reap, cancel...),
--    the trigger deletes its waiter rows and, if there were any, sends
--    NOTIFY leaseq_done, '<id>'. The notification is only a wake-up: the waiter re-reads the
--    job row, which is the truth. Flagging never touches the job row, so it never holds a lock
--    that a claim's FOR UPDATE SKIP LOCKED would skip (which is also why job_waiters has no
--    foreign key: its check would KEY SHARE-lock the job row).
--
--    No completion is missed although the flag and the completion touch different rows: both
--    take the advisory lock of the job's bucket (class 1819370496, key id mod 256). The
--    completion takes it SHARED before it looks for waiters and holds it until its transaction
--    ends, so completions never wait for each other, and a transaction that finishes any
--    number of jobs holds at most 256 locks (one per job would exhaust the lock table on a
--    bulk update: max_locks_per_transaction). The flag statement TRIES it exclusively, never
--    waiting, so no cycle of waits can form; a flag made by enqueue(wait=True) takes no lock
--    at all (no completion can finish a job that is not committed yet).
--    - Flag got the lock: a completion in that bucket waits for the flag's commit and then
--      sees its row.
--    - Flag did not (a completion in that bucket holds it): the flag's row is inserted anyway,
--      and after its commit the waiter waits for the bucket's lock on its own, holding nothing,
--      until every completion that was in flight has ended; then it reads the job, which is
--      finished (or not: then the row it inserted is seen by the next completion).
--    This relies on the finishing transaction being READ COMMITTED (the trigger's look-up takes
--    a fresh snapshot after the lock), as all of leaseq's statements are.
--
--    No role needs SECURITY DEFINER for this: a producer inserts waiter rows only for jobs
--    its row-level security lets it see (the ones it enqueued); the finishing role (worker or
--    operator) may read and delete waiter rows.
--
-- 2. leaseq.enqueue(...) and leaseq.job_status(id): for producers in other languages, drivers,
--    triggers and psql. They run with the caller's privileges (SECURITY INVOKER), so the
--    producer role's INSERT column list and row-level security still decide what it may do.
--    enqueue checks its arguments with the same rules as the Python API
--    (worker/leaseq/core/validation.py; tests/integration/test_sql_functions.py checks both
--    faces reject the same inputs) and raises SQLSTATE 22023 (invalid_parameter_value) with
--    COLUMN set to the bad argument; it wakes workers (NOTIFY leaseq_jobs, '<queue>') in the
--    caller's transaction, as the Python enqueue does. apply_grants grants EXECUTE on both to
--    the producer role only.

CREATE TABLE leaseq.job_waiters (
    job_id bigint PRIMARY KEY,
    since  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE leaseq.job_waiters ENABLE ROW LEVEL SECURITY;

CREATE FUNCTION leaseq.notify_done() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1819370496, mod(NEW.id, 256)::integer);
    DELETE FROM leaseq.job_waiters w WHERE w.job_id = NEW.id;
    IF FOUND THEN
        PERFORM pg_notify('leaseq_done', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_done
    AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'dead', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION leaseq.notify_done();

-- Enqueues one job, as Queue.enqueue does; returns its id, and created = false when an
-- unfinished job with the same dedup_key in the queue was found instead.
CREATE FUNCTION leaseq.enqueue(
    queue text,
    job_type text,
    payload jsonb DEFAULT 'null',
    priority integer DEFAULT 100,
    run_at timestamptz DEFAULT NULL,
    delay double precision DEFAULT 0,
    max_attempts integer DEFAULT 5,
    timeout double precision DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    dedup_key text DEFAULT NULL,
    wait boolean DEFAULT false
) RETURNS TABLE (id bigint, created boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
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
    ELSIF enqueue.max_attempts IS NULL OR enqueue.max_attempts < 1 THEN
        field := 'max_attempts'; problem := format('must be at least 1, got %s', coalesce(enqueue.max_attempts::text, 'NULL'));
    ELSIF enqueue.timeout IN ('NaN', 'Infinity', '-Infinity') THEN
        field := 'timeout'; problem := format('must be a finite number, got %s', enqueue.timeout);
    ELSIF enqueue.timeout < 0 THEN
        field := 'timeout'; problem := format('must not be negative, got %s', enqueue.timeout);
    ELSIF enqueue.timeout = 0 THEN
        field := 'timeout'; problem := 'must be greater than zero';
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
                                  timeout, idempotency_key, dedup_key, created_at)
    VALUES (enqueue.queue, enqueue.job_type, coalesce(enqueue.payload, 'null'), enqueue.priority,
            enqueue.max_attempts,
            coalesce(enqueue.run_at, now() + make_interval(secs => enqueue.delay)),
            make_interval(secs => enqueue.timeout), enqueue.idempotency_key, enqueue.dedup_key, now())
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
        RETURN QUERY SELECT new_id, false;
        RETURN;
    END IF;
    PERFORM pg_notify('leaseq_jobs', enqueue.queue);
    IF enqueue.wait THEN
        -- Not committed yet, so no completion can race this flag: no lock needed.
        INSERT INTO leaseq.job_waiters (job_id) VALUES (new_id);
    END IF;
    RETURN QUERY SELECT new_id, true;
END
$fn$;

-- Where a job stands, as the caller may see it (a producer: only the jobs it enqueued); no
-- row when there is no such job.
CREATE FUNCTION leaseq.job_status(job_id bigint)
RETURNS TABLE (status text, result jsonb, last_error text, last_error_code text,
               attempts integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.status, j.result, j.last_error, j.last_error_code, j.attempt_count
      FROM leaseq.job_view j
     WHERE j.id = job_status.job_id
$$;

REVOKE ALL ON FUNCTION leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION leaseq.job_status(bigint) FROM PUBLIC;

-- leaseq.apply_grants() of version 3, extended with the waiters and the functions above: the
-- version 3 function does everything it did (revoking everything from the old and given
-- roles first, and dropping leaseq's policies), then:
-- worker, operator: read and delete the waiter rows of the jobs they finish (the completion
--           trigger runs as the finishing role; prune removes a waiter whose job it deletes).
-- producer: may wait for the jobs it enqueued (the policy on jobs hides the others) and call
--           leaseq.enqueue and leaseq.job_status.
ALTER FUNCTION leaseq.apply_grants(regrole, regrole, regrole) RENAME TO apply_grants_v3;

CREATE FUNCTION leaseq.apply_grants(worker regrole, operator regrole, producer regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    previous regrole[] := ARRAY(SELECT c.role_oid::regrole FROM leaseq.component_roles c
                                 WHERE EXISTS (SELECT 1 FROM pg_roles p WHERE p.oid = c.role_oid));
    r regrole;
    stmt text;
    stmts text[] := ARRAY[]::text[];
BEGIN
    RETURN QUERY SELECT s FROM leaseq.apply_grants_v3(worker, operator, producer) s;
    FOR r IN SELECT DISTINCT g FROM unnest(previous || ARRAY[worker, operator, producer]) g
              WHERE g IS NOT NULL LOOP
        stmts := stmts || format('REVOKE ALL ON FUNCTION leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean), leaseq.job_status(bigint) FROM %s', r);
    END LOOP;
    IF worker IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT, DELETE ON leaseq.job_waiters TO %s', worker),
            format('CREATE POLICY leaseq_worker_done ON leaseq.job_waiters FOR ALL TO %s USING (true)', worker)];
    END IF;
    IF operator IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT, DELETE ON leaseq.job_waiters TO %s', operator),
            format('CREATE POLICY leaseq_operator_done ON leaseq.job_waiters FOR ALL TO %s USING (true)', operator)];
    END IF;
    IF producer IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT INSERT (job_id) ON leaseq.job_waiters TO %s', producer),
            format('CREATE POLICY leaseq_producer_wait ON leaseq.job_waiters FOR INSERT TO %s WITH CHECK (EXISTS (SELECT 1 FROM leaseq.jobs j WHERE j.id = job_id))', producer),
            format('GRANT EXECUTE ON FUNCTION leaseq.enqueue(text, text, jsonb, integer, timestamptz, double precision, integer, double precision, text, text, boolean), leaseq.job_status(bigint) TO %s', producer)];
    END IF;
    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants(regrole, regrole, regrole) FROM PUBLIC;
