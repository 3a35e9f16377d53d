-- Producers wait for results.
--
-- A job whose producer may wait (flagged notify_done) sends NOTIFY leaseq_done, '<id>' when it
-- reaches a final status, in the transaction that finishes it, whichever statement does it
-- (complete, fail, release, reap, cancel, and any later one). The notification is only a
-- wake-up: a waiter re-reads the row, which is the truth. Jobs nobody waits for pay only the
-- trigger's WHEN test, which queues nothing.
ALTER TABLE leaseq.jobs ADD COLUMN notify_done boolean NOT NULL DEFAULT false;

CREATE FUNCTION leaseq.notify_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leaseq_done', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_done
    AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW
    WHEN (NEW.notify_done AND NEW.status IN ('succeeded', 'dead', 'cancelled')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION leaseq.notify_done();

-- Flags unfinished jobs so their final transition notifies. Called by a waiter after it
-- LISTENs and before it reads the row: a completion that commits first is seen by the read;
-- one that commits later waits for this row lock and then sees the flag. SECURITY DEFINER
-- because no client role may UPDATE jobs; it changes only the flag, and only of jobs that
-- the caller's own role enqueued (or, for the table's owner and superusers, any job).
CREATE FUNCTION leaseq.watch_jobs(ids bigint[]) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    WITH flagged AS (
        UPDATE leaseq.jobs j
           SET notify_done = true
         WHERE j.id = ANY (ids) AND NOT j.notify_done
           AND j.status NOT IN ('succeeded', 'dead', 'cancelled')
           AND (j.enqueued_by = session_user
                OR pg_has_role(session_user, (SELECT c.relowner FROM pg_class c
                                               WHERE c.oid = 'leaseq.jobs'::regclass), 'MEMBER'))
        RETURNING j.id
    )
    SELECT count(*)::integer FROM flagged
$$;
