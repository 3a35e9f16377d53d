-- leaseq schema: the operator may VACUUM leaseq.flow_keys, as it may leaseq.jobs.
--
-- The keyed claim walks the active keys of a queue in their turn order
-- (flow_keys_turn_idx, WHERE active) from its head. A key whose last job finishes goes
-- inactive, and its entry at the head of that index stays behind, dead, until VACUUM:
-- nothing is inserted there again, so no page-level cleanup ever reaches it. With 100,000
-- keys of one job each and 4 claimers, a claim read 40 buffers at the start of a drain and
-- 92 after 7,500 jobs (PostgreSQL 18.6). The reaper's vacuum duty (LEASEQ_VACUUM_DEAD_TUPLES)
-- now covers leaseq.flow_keys as well; on PostgreSQL >= 17 the operator role gets MAINTAIN on
-- it (older servers: leave it to autovacuum, or run the operator as the owner).
--
-- apply_grants of version 15 does everything it did, then that one grant.
ALTER FUNCTION leaseq.apply_grants(regrole, regrole, regrole) RENAME TO apply_grants_v15;

CREATE FUNCTION leaseq.apply_grants(worker regrole, operator regrole, producer regrole)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    stmt text;
BEGIN
    RETURN QUERY SELECT s FROM leaseq.apply_grants_v15(worker, operator, producer) s;
    IF operator IS NOT NULL AND current_setting('server_version_num')::int >= 170000 THEN
        stmt := format('GRANT MAINTAIN ON leaseq.flow_keys TO %s', operator);
        EXECUTE stmt;
        RETURN NEXT stmt;
    END IF;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants(regrole, regrole, regrole) FROM PUBLIC;
