-- leaseq's present tense: signals to jobs (ctx.wait_for; docs/concepts/waits.md).
--
-- Covers: leaseq.signal (granted to the producer and operator roles by apply_grants, in
-- grants.sql) and leaseq.job_signals_wake, the trigger that wakes a job waiting for the
-- signal just inserted.
-- Set off by: Queue.signal and AsyncQueue.signal (queries/signals.sql, job_signal), `leaseq
-- signal`, other languages' producers; the trigger by any insert into leaseq.job_signals.
--
-- No signal is lost to a race with the worker that hands the job back to wait: the trigger
-- locks the job's row before it looks at what the job waits for, and the hand-back
-- (job_wait_lock then job_wait) locks it before it looks for the signal, each in a statement
-- of its own (a fresh snapshot in READ COMMITTED). Whichever locks second runs after the
-- other has committed and sees what it wrote: the signal, or that the job waits for it.

-- Sends the signal `name` with `payload` to job `job_id`, as its caller: a producer reaches
-- only the jobs its login enqueued (the others do not exist for it). One signal per (job,
-- name): the first is kept, a later one under that name is not stored (stored = false). A
-- job waiting for `name` becomes claimable at once (waiting = true). A finished job, or
-- none, is an error; so are a name of 0 or more than 200 characters and a payload of more
-- than 65536 bytes as JSON, each naming the argument (as leaseq.InvalidJob).
CREATE OR REPLACE FUNCTION leaseq.signal(job_id bigint, name text, payload jsonb DEFAULT 'null')
RETURNS TABLE (stored boolean, waiting boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    field text;
    problem text;
    found_status text;
    did_store boolean := false;
BEGIN
    -- The same rules, in the same order, as leaseq.core.validation (signal_name, signal).
    IF signal.name IS NULL OR signal.name = '' THEN
        field := 'name'; problem := 'must not be empty';
    ELSIF length(signal.name) > 200 THEN
        field := 'name'; problem := format('is %s characters long; the limit is 200', length(signal.name));
    ELSIF octet_length(coalesce(signal.payload, 'null')::text) > 65536 THEN
        field := 'payload'; problem := format('is %s bytes as JSON; the limit is 65536', octet_length(signal.payload::text));
    END IF;
    IF field IS NOT NULL THEN
        RAISE EXCEPTION 'invalid %: %; nothing was written', field, problem
            USING ERRCODE = 'invalid_parameter_value', COLUMN = field, DETAIL = problem;
    END IF;
    SELECT j.status::text INTO found_status FROM leaseq.jobs j WHERE j.id = signal.job_id;
    IF found_status IS NULL THEN
        -- Worded so it does not tell whether another role's job has this id.
        RAISE EXCEPTION 'job % does not exist for this role (it may have been pruned, or enqueued by another role); check the id',
            signal.job_id USING ERRCODE = 'no_data_found';
    END IF;
    IF found_status IN ('succeeded', 'dead', 'cancelled') THEN
        RAISE EXCEPTION 'job % has finished (%): a signal can no longer reach it; nothing was written',
            signal.job_id, found_status USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    INSERT INTO leaseq.job_signals AS s (job_id, name, payload)
    VALUES (signal.job_id, signal.name, coalesce(signal.payload, 'null'))
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING true INTO did_store;
    -- A statement of its own: it sees what the trigger (or an earlier signal's) wrote.
    RETURN QUERY
        SELECT coalesce(did_store, false), coalesce(j.status::text = 'pending' AND j.waiting_for = signal.name, false)
          FROM leaseq.jobs j WHERE j.id = signal.job_id;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.signal(bigint, text, jsonb) FROM PUBLIC;

-- Fired by each signal inserted: locks its job's row (see the top of this file), refuses a
-- finished job or one that would hold more than 1,000 signals or 4 MiB of their payloads,
-- and makes a job that waits for this signal's name claimable now. SECURITY
-- DEFINER: the sender may not change jobs itself.
CREATE OR REPLACE FUNCTION leaseq.job_signals_wake()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    found_status text;
    found_queue text;
    found_key text;
    held bigint;
    held_bytes bigint;
BEGIN
    SELECT j.status::text, j.queue, j.key INTO found_status, found_queue, found_key
      FROM leaseq.jobs j WHERE j.id = NEW.job_id FOR UPDATE;
    IF found_status IN ('succeeded', 'dead', 'cancelled') THEN
        RAISE EXCEPTION 'job % has finished (%): a signal can no longer reach it; nothing was written',
            NEW.job_id, found_status USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- Bounded per job, whoever inserts (the API's leaseq.core.validation.MAX_SIGNALS_PER_JOB
    -- and MAX_SIGNAL_BYTES_PER_JOB): the row lock above orders two senders to one job.
    SELECT count(*), coalesce(sum(octet_length(s.payload::text)), 0) INTO held, held_bytes
      FROM leaseq.job_signals s WHERE s.job_id = NEW.job_id;
    IF held > 1000 OR held_bytes > 4194304 THEN
        RAISE EXCEPTION 'invalid signal: job % would hold % signals of % bytes; a job holds at most 1000 signals and 4194304 bytes of their payloads; nothing was written',
            NEW.job_id, held, held_bytes
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'signal',
                  DETAIL = 'a job holds at most 1000 signals and 4194304 bytes of their payloads';
    END IF;
    UPDATE leaseq.jobs j SET available_at = now()
     WHERE j.id = NEW.job_id AND j.status = 'pending' AND j.waiting_for = NEW.name
       AND j.available_at > now();
    IF FOUND THEN
        -- Its key may sleep until the wait's deadline (flow_settle): in turn again now.
        UPDATE leaseq.flow_keys f SET next_at = NULL
         WHERE found_key IS NOT NULL AND f.queue = found_queue AND f.key = found_key
           AND f.next_at IS NOT NULL;
        PERFORM pg_notify('leaseq_jobs', found_queue);
    END IF;
    RETURN NULL;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.job_signals_wake() FROM PUBLIC;

CREATE OR REPLACE TRIGGER job_signals_wake AFTER INSERT ON leaseq.job_signals
    FOR EACH ROW EXECUTE FUNCTION leaseq.job_signals_wake();
