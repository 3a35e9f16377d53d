-- leaseq's present tense: the workers' registry (leaseq.workers) holds a bounded number of
-- rows per login.
--
-- Covers: leaseq.workers_bounded and its trigger.
-- Set off by: every INSERT into leaseq.workers (worker_upsert in queries/workers.sql, or a
-- raw insert of a worker login).

-- Refuses a statement that leaves a login with more than 10,000 registered workers, so a
-- hostile worker login cannot bury the registry (the console's Workers page, `leaseq
-- status`, the operator's metrics) under fake rows; a real fleet registers one row per
-- worker process, and the operator forgets a silent one. A statement trigger with the
-- statement's new rows: a per-row check would see the table as it was before a
-- multi-row insert.
CREATE OR REPLACE FUNCTION leaseq.workers_bounded()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    login text;
    held bigint;
BEGIN
    FOR login IN SELECT DISTINCT a.registered_by FROM added a LOOP
        SELECT count(*) INTO held FROM leaseq.workers w WHERE w.registered_by = login;
        IF held > 10000 THEN
            RAISE EXCEPTION 'login % would register % workers; a login registers at most 10000 (stale ones are forgotten by the operator); nothing was written',
                login, held
                USING ERRCODE = 'program_limit_exceeded';
        END IF;
    END LOOP;
    RETURN NULL;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.workers_bounded() FROM PUBLIC;

CREATE OR REPLACE TRIGGER workers_bounded AFTER INSERT ON leaseq.workers
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION leaseq.workers_bounded();
