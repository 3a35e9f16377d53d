-- leaseq schema: the failover epoch is read once per claim, not once per claimed row.
-- leaseq.lease_token_next(token) read leaseq.lease_epoch() for every row a claim leased (a
-- SQL function that cannot be inlined, since it calls volatile functions): 5 us a row. It
-- now takes the epoch, which each claim reads once, `(SELECT leaseq.lease_epoch())`, and is
-- inlined. The tokens it gives are the same.

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
             AND NEW.lease_token = leaseq.lease_token_next(OLD.lease_token, leaseq.lease_epoch()))
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

DROP FUNCTION leaseq.lease_token_next(bigint);

CREATE OR REPLACE FUNCTION leaseq.lease_token_next(token bigint, epoch bigint)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE
AS $function$
    SELECT greatest(token + 1, epoch)
$function$
;
