-- leaseq schema: a lease token is never handed out twice across a failover
-- (docs/operations/failover.md).
--
-- A claim lost in an asynchronous failover (committed on the primary, never replicated) left
-- the promoted standby one token behind: the next claim of that job issued the lost token
-- again, under the same owner when the same worker reconnected, and two executions held one
-- (owner, token). A claim now gives leaseq.lease_token_next(token): one more, and at least
-- leaseq.lease_epoch() = (timeline - 1) << 32, the server's timeline read from its current
-- WAL file's name, which a promotion raises at once. A claim after a failover outranks every
-- token of the lost timeline; a cluster never failed over (timeline 1) keeps its tokens as
-- they were. The worker role's fence accepts a claim's token by the same function, and a
-- worker compares the epoch on each new connection (the server_identity statement).

CREATE OR REPLACE FUNCTION leaseq.jobs_worker_fence()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    marked leaseq.jobs := OLD;
BEGIN
    marked.has_children := NEW.has_children;
    IF marked IS NOT DISTINCT FROM NEW THEN
        RETURN NEW;
    END IF;
    IF NOT ((OLD.status = 'pending' AND NEW.status = 'running'
             AND NEW.lease_token = leaseq.lease_token_next(OLD.lease_token))
            OR (OLD.status = 'running' AND OLD.lease_expires_at > now()
                AND (NEW.lease_token = OLD.lease_token
                     OR (NEW.status = 'pending' AND NEW.lease_token = OLD.lease_token + 1)))) THEN
        RAISE EXCEPTION 'a worker may change job % only by claiming it or while it holds its lease; it is % with token %',
            OLD.id, OLD.status, OLD.lease_token
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.available_at IS DISTINCT FROM OLD.available_at
       AND NOT (isfinite(NEW.available_at) AND NEW.available_at <= now() + interval '3650 days') THEN
        RAISE EXCEPTION 'invalid run_at: must be a finite time within 3650 days of now, got %; nothing was written', NEW.available_at
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'run_at';
    END IF;
    RETURN NEW;
END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_epoch()
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN NOT pg_catalog.pg_is_in_recovery()
                THEN (('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1) << 32
           END
$function$
;

CREATE OR REPLACE FUNCTION leaseq.lease_token_next(token bigint)
 RETURNS bigint
 LANGUAGE sql
 STABLE
AS $function$
    SELECT greatest(token + 1, leaseq.lease_epoch())
$function$
;
