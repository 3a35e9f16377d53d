-- Named statements of a deployment's tenants (definitions/tenants.sql): which roles may use
-- a queue. Run as the owner of leaseq's tables (`leaseq queues give`, `leaseq queues show`).

-- name: queue_roles_set
-- Gives queue %(queue)s to the roles %(roles)s as %(component)s ('worker' or 'producer'), replacing the roles it had as that component (none: open to every role of it); the roles it has now.
SELECT r.role_name FROM leaseq.queue_roles_set(%(queue)s, %(component)s, %(roles)s::regrole[]) r;

-- name: queue_roles_list
-- Every queue given to roles, with its component and role, in order.
SELECT r.queue, r.component, r.role_oid::regrole::text AS role_name
  FROM leaseq.queue_roles r
 ORDER BY r.queue, r.component, r.role_oid::regrole::text;
