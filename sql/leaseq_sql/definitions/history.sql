-- leaseq's present tense: the partitioned history's upkeep, run by the leader.
--
-- Covers: leaseq.history_ensure_partitions, leaseq.history_expire_step (granted to the
-- operator role by apply_grants, grants.sql). Set off by: history_ensure_partitions and
-- history_expire_step in queries/history.sql.

-- Creates the day partitions (and their keep_days leaves) that the mover may write into:
-- every UTC day from the oldest finished job still in leaseq.jobs (no earlier than the
-- longest retention allows) to `ahead` days after now, for every retention in use. Only
-- missing ones are created (a CREATE takes a brief lock on the parent). Returns their names.
CREATE OR REPLACE FUNCTION leaseq.history_ensure_partitions(ahead integer, at timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    longest integer := (SELECT max(keep_days) FROM leaseq.history_retention);
    oldest timestamptz;
    first_day date;
    d date;
    k integer;
    parent text;
    made text[] := ARRAY[]::text[];
    name text;
BEGIN
    SELECT j.finished_at INTO oldest FROM leaseq.jobs j
     WHERE j.status IN ('succeeded', 'dead', 'cancelled')
     ORDER BY j.finished_at LIMIT 1;
    first_day := greatest((least(oldest, at) AT TIME ZONE 'UTC')::date,
                          (at AT TIME ZONE 'UTC')::date - longest - 1);
    FOR parent IN SELECT unnest(ARRAY['job_history', 'job_attempt_history']) LOOP
        d := first_day;
        WHILE d <= (at AT TIME ZONE 'UTC')::date + ahead LOOP
            name := format('%s_d%s', parent, to_char(d, 'YYYYMMDD'));
            IF to_regclass('leaseq.' || name) IS NULL THEN
                EXECUTE format(
                    'CREATE TABLE leaseq.%I PARTITION OF leaseq.%I FOR VALUES FROM (%L) TO (%L) PARTITION BY LIST (keep_days)',
                    name, parent, d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC');
                made := made || name;
            END IF;
            FOR k IN SELECT DISTINCT r.keep_days FROM leaseq.history_retention r ORDER BY 1 LOOP
                IF d + 1 + k > (at AT TIME ZONE 'UTC')::date
                   AND to_regclass(format('leaseq.%s_k%s', name, k)) IS NULL THEN
                    EXECUTE format('CREATE TABLE leaseq.%I PARTITION OF leaseq.%I FOR VALUES IN (%s)',
                                   name || '_k' || k, name, k);
                    made := made || (name || '_k' || k);
                END IF;
            END LOOP;
            d := d + 1;
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT unnest(made);
END
$fn$;

-- One step of retention, one short transaction: takes the oldest job_history leaf whose day
-- ended keep_days before `at`, deletes up to `batch` effects (leaseq.job_results rows) its
-- jobs produced, and once none is left drops the leaf and its attempts' leaf (and a day whose
-- last leaf went). Returns the leaf, the effects deleted and whether it was dropped; no row
-- when nothing has expired. Effects are the one thing deleted row by row: job_results is the
-- conflict target of every completion, so it cannot be partitioned by finish time.
CREATE OR REPLACE FUNCTION leaseq.history_expire_step(at timestamptz, batch integer,
                                           OUT leaf text, OUT effects bigint, OUT dropped boolean)
RETURNS SETOF record
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    day_name text;
    twin text;
BEGIN
    SELECT c.relname, p.relname INTO leaf, day_name
      FROM pg_inherits i
      JOIN pg_class c ON c.oid = i.inhrelid
      JOIN pg_class p ON p.oid = i.inhparent
      JOIN pg_inherits top ON top.inhrelid = p.oid
     WHERE top.inhparent = 'leaseq.job_history'::regclass
       AND to_date(substring(p.relname FROM '_d(\d{8})$'), 'YYYYMMDD') + 1
           + substring(c.relname FROM '_k(\d+)$')::int <= (at AT TIME ZONE 'UTC')::date
     ORDER BY p.relname, c.relname
     LIMIT 1;
    IF leaf IS NULL THEN
        -- A day whose leaves have all gone (or never came) is dropped once it is older than
        -- the longest retention.
        SELECT p.relname INTO day_name
          FROM pg_inherits top JOIN pg_class p ON p.oid = top.inhrelid
         WHERE top.inhparent = 'leaseq.job_history'::regclass
           AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = p.oid)
           AND to_date(substring(p.relname FROM '_d(\d{8})$'), 'YYYYMMDD') + 1
               + (SELECT max(keep_days) FROM leaseq.history_retention) <= (at AT TIME ZONE 'UTC')::date
         ORDER BY p.relname LIMIT 1;
        IF day_name IS NULL THEN
            RETURN;
        END IF;
        EXECUTE format('DROP TABLE leaseq.%I', day_name);
        EXECUTE format('DROP TABLE IF EXISTS leaseq.%I',
                       replace(day_name, 'job_history_', 'job_attempt_history_'));
        leaf := day_name; effects := 0; dropped := true;
        RETURN NEXT;
        RETURN;
    END IF;
    EXECUTE format(
        'WITH v AS (SELECT r.queue, r.job_type, r.idempotency_key FROM leaseq.%I h'
        '  JOIN leaseq.job_results r ON r.queue = h.queue AND r.job_type = h.job_type'
        '   AND r.idempotency_key = h.idempotency_key AND r.job_id = h.id'
        ' WHERE h.idempotency_key IS NOT NULL LIMIT %s)'
        ' DELETE FROM leaseq.job_results r USING v WHERE r.queue = v.queue'
        '   AND r.job_type = v.job_type AND r.idempotency_key = v.idempotency_key', leaf, batch);
    GET DIAGNOSTICS effects = ROW_COUNT;
    dropped := effects < batch;
    IF dropped THEN
        twin := replace(leaf, 'job_history_', 'job_attempt_history_');
        EXECUTE format('DROP TABLE leaseq.%I', leaf);
        EXECUTE format('DROP TABLE IF EXISTS leaseq.%I', twin);
    END IF;
    RETURN NEXT;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.history_ensure_partitions(integer, timestamptz),
    leaseq.history_expire_step(timestamptz, integer) FROM PUBLIC;
