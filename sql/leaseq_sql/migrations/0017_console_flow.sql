-- leaseq schema: the web console shows flow control (docs/guides/console.md, "Flow").
--
-- The console role may read leaseq.flow_limits, leaseq.flow_keys, leaseq.flow_slots and
-- leaseq.flow_aggregates (no row policies: none has row level security). The Flow page is
-- read-only: no new function, no admin grant. apply_console_grants() of version 16 is wrapped
-- the way 0016 wraps version 13 (version 13, run inside it, revokes everything from the
-- previous console roles and the given one first).
--
-- Blocked aggregates in (queue, ordering_key) order: the page's keyset over them is one range
-- of this index, however many aggregates are not blocked. Only blocked rows are in it (a dead
-- head is rare); the enqueue's next_seq update leaves it alone.
CREATE INDEX flow_aggregates_blocked_key_idx ON leaseq.flow_aggregates (queue, ordering_key)
    WHERE blocked_by IS NOT NULL;

ALTER FUNCTION leaseq.apply_console_grants(regrole, boolean) RENAME TO apply_console_grants_v16;

CREATE FUNCTION leaseq.apply_console_grants(console regrole, admin boolean)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    stmt text;
BEGIN
    RETURN QUERY SELECT s FROM leaseq.apply_console_grants_v16(console, admin) s;
    IF console IS NOT NULL THEN
        stmt := format('GRANT SELECT ON leaseq.flow_limits, leaseq.flow_keys, leaseq.flow_slots, leaseq.flow_aggregates TO %s', console);
        EXECUTE stmt;
        RETURN NEXT stmt;
    END IF;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_console_grants(regrole, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION leaseq.apply_console_grants_v16(regrole, boolean) FROM PUBLIC;
