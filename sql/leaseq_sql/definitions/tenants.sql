-- leaseq's present tense: which roles may use a queue (a deployment's tenants).
--
-- Covers: leaseq.queue_open_to, leaseq.queue_open, leaseq.queue_roles_exist, leaseq.lease_queues and
-- leaseq.queue_roles_set, over the table leaseq.queue_roles (migration 0049).
-- Set off by: the producer's row policy on leaseq.jobs (apply_grants, grants.sql), the
-- claims (claims.sql), a worker's code schedule (schedule_put, schedules.sql), a fan-out
-- (lease_spawn, lease.sql), and `leaseq queues give` (queue_roles_set in queries/tenants.sql).
--
-- A queue with no row for a component is open to every role of that component: a
-- single-team install names no roles and keeps one team's behaviour. A queue with rows for
-- a component is open only to logins that are members of one of those roles (and to the
-- owner of leaseq's tables).

-- Whether `who` (a login or role name) may use `queue` as `component` ('worker': claim from
-- it, declare code schedules into it; 'producer': enqueue into it, a fan-out of its jobs
-- included). SECURITY DEFINER so that no component needs to read the table, which names
-- every tenant's queues.
CREATE OR REPLACE FUNCTION leaseq.queue_open_to(queue text, component text, who name)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT NOT EXISTS (SELECT 1 FROM leaseq.queue_roles r
                        WHERE r.queue = queue_open_to.queue
                          AND r.component = queue_open_to.component)
        OR EXISTS (SELECT 1 FROM leaseq.queue_roles r
                    WHERE r.queue = queue_open_to.queue
                      AND r.component = queue_open_to.component
                      -- a dropped role (its oid left here) admits nobody, and errs nowhere
                      AND CASE WHEN EXISTS (SELECT 1 FROM pg_roles g WHERE g.oid = r.role_oid)
                               THEN pg_has_role(queue_open_to.who, r.role_oid, 'MEMBER')
                               ELSE false END)
        OR pg_has_role(queue_open_to.who,
                       (SELECT c.relowner FROM pg_class c WHERE c.oid = 'leaseq.jobs'::regclass),
                       'USAGE')
$$;

REVOKE ALL ON FUNCTION leaseq.queue_open_to(text, text, name) FROM PUBLIC;

-- Whether this session's login may use `queue` as `component`: queue_open_to for
-- session_user, for a producer's row policy (a component may ask only about itself, not
-- probe which roles another tenant's queue is given to).
CREATE OR REPLACE FUNCTION leaseq.queue_open(queue text, component text)
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT leaseq.queue_open_to(queue_open.queue, queue_open.component, session_user)
$$;

REVOKE ALL ON FUNCTION leaseq.queue_open(text, text) FROM PUBLIC;

-- Whether any queue is given to roles: a policy asks it once per statement (a scalar
-- sub-select), so an install without tenants pays no per-row call.
CREATE OR REPLACE FUNCTION leaseq.queue_roles_exist()
RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM leaseq.queue_roles)
$$;

REVOKE ALL ON FUNCTION leaseq.queue_roles_exist() FROM PUBLIC;

-- The queues of a claim that its caller's login may claim from (all of them when no queue
-- is given to roles). Run inside the claims, as the owner: session_user is the login.
CREATE OR REPLACE FUNCTION leaseq.lease_queues(queues text[])
RETURNS text[]
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM leaseq.queue_roles) THEN lease_queues.queues
                ELSE ARRAY(SELECT q FROM unnest(lease_queues.queues) q
                            WHERE leaseq.queue_open_to(q, 'worker', session_user))
           END
$$;

REVOKE ALL ON FUNCTION leaseq.lease_queues(text[]) FROM PUBLIC;

-- Gives `queue` to `roles` as `component`, replacing the roles it had as that component; an
-- empty array opens it to every role of the component again. One statement's worth, in the
-- caller's transaction; only the owner of leaseq's tables may run it. Returns the roles the
-- queue has for the component now.
CREATE OR REPLACE FUNCTION leaseq.queue_roles_set(queue text, component text, roles regrole[])
RETURNS TABLE (role_name text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    IF component IS NULL OR component NOT IN ('worker', 'producer') THEN
        RAISE EXCEPTION 'component must be worker or producer, not %', coalesce(component, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'component';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9][A-Za-z0-9._:-]*$' OR length(queue) > 128 THEN
        RAISE EXCEPTION '% is not a queue name: 1-128 characters of letters, digits and . _ : -, starting with a letter or digit', coalesce(quote_literal(queue), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'queue';
    END IF;
    DELETE FROM leaseq.queue_roles r
     WHERE r.queue = queue_roles_set.queue AND r.component = queue_roles_set.component;
    INSERT INTO leaseq.queue_roles (queue, component, role_oid)
    SELECT DISTINCT queue_roles_set.queue, queue_roles_set.component, g::oid
      FROM unnest(queue_roles_set.roles) g WHERE g IS NOT NULL;
    RETURN QUERY
    SELECT r.role_oid::regrole::text FROM leaseq.queue_roles r
     WHERE r.queue = queue_roles_set.queue AND r.component = queue_roles_set.component
     ORDER BY 1;
END
$fn$;

REVOKE ALL ON FUNCTION leaseq.queue_roles_set(text, text, regrole[]) FROM PUBLIC;
