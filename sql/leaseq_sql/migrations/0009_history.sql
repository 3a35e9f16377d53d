-- leaseq schema, version 5: history that grows without slowing anything.
--
-- leaseq.jobs stays the hot table: live jobs and recently finished ones. The leader's mover
-- (leaseq_operator.history) moves finished jobs older than --hot-retention, with their
-- attempts, into leaseq.job_history / leaseq.job_attempt_history in batches, one statement
-- per batch, and writes a small leaseq.job_ledger row per job that outlives the history.
--
-- Layout of the history: partitioned BY RANGE (finished_at), one partition per UTC day,
-- created ahead of time by the leader (never by this migration, never a DEFAULT partition:
-- a row with no partition fails its batch loudly instead of landing somewhere undroppable).
-- Each day is itself partitioned BY LIST (keep_days): a job's retention in days, fixed when it
-- is moved (from leaseq.history_retention, per queue and final state). So each leaf holds
-- rows that all expire together, and retention drops a leaf once its day ended keep_days
-- ago: a drop never removes a row that must stay, and a day's partition goes when its last
-- leaf has gone. Nothing is deleted row by row except effects (see history_expire_step).
--
-- This migration moves no rows: existing finished jobs are moved by the mover afterwards,
-- in batches, with workers running (`leaseq migrate` says how many wait).

CREATE TABLE leaseq.job_history (
    id               bigint NOT NULL,
    queue            text NOT NULL,
    job_type         text NOT NULL,
    payload          jsonb NOT NULL,
    status           leaseq.job_status NOT NULL,
    priority         smallint NOT NULL,
    attempt_count    integer NOT NULL,
    max_attempts     integer NOT NULL,
    created_at       timestamptz NOT NULL,
    available_at     timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz NOT NULL,
    lease_owner      text,
    lease_token      bigint NOT NULL,
    lease_expires_at timestamptz,
    heartbeat_at     timestamptz,
    progress         jsonb,
    timeout          interval,
    last_error       text,
    last_error_code  text,
    idempotency_key  text,
    dedup_key        text,
    result           jsonb,
    checkpoint       jsonb,
    claim_id         uuid,
    enqueued_by      text NOT NULL,
    keep_days        integer NOT NULL,
    moved_at         timestamptz NOT NULL
) PARTITION BY RANGE (finished_at);

CREATE INDEX job_history_id_idx ON leaseq.job_history (id);

CREATE TABLE leaseq.job_attempt_history (
    job_id      bigint NOT NULL,
    attempt     integer NOT NULL,
    lease_token bigint NOT NULL,
    worker      text NOT NULL,
    started_at  timestamptz,
    ended_at    timestamptz NOT NULL,
    outcome     leaseq.attempt_outcome NOT NULL,
    error       text,
    traceback   text,
    -- The job's finish time and retention: attempts live and go with their job's leaf.
    finished_at timestamptz NOT NULL,
    keep_days   integer NOT NULL
) PARTITION BY RANGE (finished_at);

CREATE INDEX job_attempt_history_job_idx ON leaseq.job_attempt_history (job_id, lease_token);

-- One small row per moved job, kept long after its history leaf was dropped: "what happened
-- to job X" still has an answer.
CREATE TABLE leaseq.job_ledger (
    id              bigint PRIMARY KEY,
    queue           text NOT NULL,
    job_type        text NOT NULL,
    status          leaseq.job_status NOT NULL,
    created_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL,
    attempts        integer NOT NULL,
    last_error_code text,
    -- The first 200 characters of the last error.
    last_error      text,
    keep_days       integer NOT NULL,
    moved_at        timestamptz NOT NULL,
    CONSTRAINT job_ledger_finished CHECK (status IN ('succeeded', 'dead', 'cancelled'))
);

CREATE INDEX job_ledger_finished_idx ON leaseq.job_ledger (finished_at);

-- How long moved jobs stay in history, per queue ('*': every queue without a row of its own)
-- and final state. Read by the mover when it moves a job; a change applies to jobs moved
-- from then on.
CREATE TABLE leaseq.history_retention (
    queue     text NOT NULL,
    status    leaseq.job_status NOT NULL,
    keep_days integer NOT NULL CONSTRAINT history_retention_days CHECK (keep_days BETWEEN 1 AND 3650),
    PRIMARY KEY (queue, status),
    CONSTRAINT history_retention_finished CHECK (status IN ('succeeded', 'dead', 'cancelled')),
    CONSTRAINT history_retention_queue CHECK (queue = '*' OR queue ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$')
);

INSERT INTO leaseq.history_retention (queue, status, keep_days)
VALUES ('*', 'succeeded', 7), ('*', 'cancelled', 7), ('*', 'dead', 90);

-- The mover's state, one row: the batch size it adapts (halved on a timeout, doubled back on
-- success, so a new leader starts where the last one was) and the ledger's retention.
CREATE TABLE leaseq.history_mover (
    name             text PRIMARY KEY CONSTRAINT history_mover_one CHECK (name = 'mover'),
    batch            integer NOT NULL DEFAULT 1000 CONSTRAINT history_mover_batch CHECK (batch >= 1),
    timeouts         bigint NOT NULL DEFAULT 0,
    moved            bigint NOT NULL DEFAULT 0,
    ledger_keep_days integer NOT NULL DEFAULT 400
        CONSTRAINT history_mover_ledger_days CHECK (ledger_keep_days BETWEEN 1 AND 36500),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

INSERT INTO leaseq.history_mover (name) VALUES ('mover');

-- Counts without scanning: jobs moved per queue, final state and hour of finishing, kept by
-- the mover in the statement that moves them. Dashboards add these to the hot table's own
-- (small) counts instead of counting history.
CREATE TABLE leaseq.history_counts (
    queue  text NOT NULL,
    status leaseq.job_status NOT NULL,
    hour   timestamptz NOT NULL,
    jobs   bigint NOT NULL,
    PRIMARY KEY (queue, status, hour)
);

-- "What happened to job X", one query wherever it is:
--   SELECT * FROM leaseq.job_whereabouts WHERE id = X;
-- place = 'hot' (leaseq.jobs: live or recently finished), 'history' (moved; full row), or
-- 'ledger' (its history was dropped: queue, type, final state, times, attempts, last error).
-- Each branch is an index lookup; the history branch goes through the ledger row, whose
-- finished_at and keep_days prune the history to the one leaf that can hold the job.
CREATE VIEW leaseq.job_whereabouts WITH (security_invoker = true) AS
SELECT 'hot'::text AS place, j.id, j.queue, j.job_type, j.payload, j.status::text AS status,
       j.priority, j.attempt_count, j.max_attempts, j.created_at, j.available_at, j.started_at,
       j.finished_at, j.lease_owner, j.lease_token, j.lease_expires_at, j.heartbeat_at,
       j.progress, extract(epoch FROM j.timeout)::float8 AS timeout_seconds, j.last_error,
       j.last_error_code, j.idempotency_key, j.dedup_key, j.result, j.checkpoint
  FROM leaseq.jobs j
UNION ALL
SELECT CASE WHEN h.id IS NULL THEN 'ledger' ELSE 'history' END, l.id, l.queue, l.job_type,
       h.payload, l.status::text, h.priority, l.attempts, h.max_attempts, l.created_at,
       h.available_at, h.started_at, l.finished_at, h.lease_owner, h.lease_token,
       h.lease_expires_at, h.heartbeat_at, h.progress,
       extract(epoch FROM h.timeout)::float8, coalesce(h.last_error, l.last_error),
       l.last_error_code, h.idempotency_key, h.dedup_key, h.result, h.checkpoint
  FROM leaseq.job_ledger l
  -- LATERAL with OFFSET 0, so the ledger's values reach the history as parameters and the
  -- executor prunes every partition but one (a plain join would probe each day's index).
  LEFT JOIN LATERAL (
      SELECT * FROM leaseq.job_history x
       WHERE x.id = l.id AND x.finished_at = l.finished_at AND x.keep_days = l.keep_days
      OFFSET 0
  ) h ON true;

-- Creates the day partitions (and their keep_days leaves) that the mover may write into:
-- every UTC day from the oldest finished job still in leaseq.jobs (no earlier than the
-- longest retention allows) to `ahead` days after now, for every retention in use. Only
-- missing ones are created (a CREATE takes a brief lock on the parent). Returns their names.
CREATE FUNCTION leaseq.history_ensure_partitions(ahead integer, at timestamptz)
RETURNS SETOF text
LANGUAGE plpgsql
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
CREATE FUNCTION leaseq.history_expire_step(at timestamptz, batch integer,
                                           OUT leaf text, OUT effects bigint, OUT dropped boolean)
RETURNS SETOF record
LANGUAGE plpgsql
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

-- The partition functions create and drop tables, which only the owner may do: they run as
-- the owner (SECURITY DEFINER, fixed search_path, every name qualified) for the roles granted
-- EXECUTE, the operator's.
ALTER FUNCTION leaseq.history_ensure_partitions(integer, timestamptz) SECURITY DEFINER;
ALTER FUNCTION leaseq.history_expire_step(timestamptz, integer) SECURITY DEFINER;
REVOKE ALL ON FUNCTION leaseq.history_ensure_partitions(integer, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION leaseq.history_expire_step(timestamptz, integer) FROM PUBLIC;

-- leaseq.apply_grants() of version 7, extended with the history: the version 7 function does
-- everything it did (revoking everything from old and given roles first, tables included),
-- then the operator, which runs the leader's history duties, gets what they need:
-- operator: reads the history, the ledger, the rules and the counts; writes the history, the
--           ledger, the counts and the mover's state; sets the rules; deletes effects whose
--           job's retention ended; runs the partition functions. Nothing new for workers or
--           producers (`leaseq jobs show` of a moved job needs the operator's role).
ALTER FUNCTION leaseq.apply_grants(regrole, regrole, regrole) RENAME TO apply_grants_v7;

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
    RETURN QUERY SELECT s FROM leaseq.apply_grants_v7(worker, operator, producer) s;
    FOR r IN SELECT DISTINCT g FROM unnest(previous || ARRAY[worker, operator, producer]) g
              WHERE g IS NOT NULL LOOP
        stmts := stmts || format('REVOKE ALL ON FUNCTION leaseq.history_ensure_partitions(integer, timestamptz), leaseq.history_expire_step(timestamptz, integer) FROM %s', r);
    END LOOP;
    IF operator IS NOT NULL THEN
        stmts := stmts || ARRAY[
            format('GRANT SELECT ON leaseq.job_whereabouts, leaseq.job_history, leaseq.job_attempt_history, leaseq.job_ledger, leaseq.history_retention, leaseq.history_counts, leaseq.history_mover TO %s', operator),
            format('GRANT INSERT ON leaseq.job_history, leaseq.job_attempt_history TO %s', operator),
            format('GRANT INSERT, DELETE ON leaseq.job_ledger TO %s', operator),
            format('GRANT INSERT, UPDATE, DELETE ON leaseq.history_counts, leaseq.history_retention TO %s', operator),
            format('GRANT UPDATE ON leaseq.history_mover TO %s', operator),
            format('GRANT DELETE ON leaseq.job_results TO %s', operator),
            format('CREATE POLICY leaseq_operator_expire ON leaseq.job_results FOR DELETE TO %s USING (true)', operator),
            format('GRANT EXECUTE ON FUNCTION leaseq.history_ensure_partitions(integer, timestamptz), leaseq.history_expire_step(timestamptz, integer) TO %s', operator)];
    END IF;
    FOREACH stmt IN ARRAY stmts LOOP
        EXECUTE stmt;
        RETURN NEXT stmt;
    END LOOP;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.apply_grants(regrole, regrole, regrole) FROM PUBLIC;
