-- Named statements used by `leaseq migrate`.

-- name: migration_lock
-- Waits for the session advisory lock that serialises concurrent `leaseq migrate` runs.
SELECT pg_advisory_lock(hashtextextended('leaseq.migrate', 0));

-- name: migration_unlock
-- Releases the migration advisory lock.
SELECT pg_advisory_unlock(hashtextextended('leaseq.migrate', 0));

-- name: migration_bootstrap
-- Creates the leaseq schema and its schema_migrations table if missing.
CREATE SCHEMA IF NOT EXISTS leaseq;
CREATE TABLE IF NOT EXISTS leaseq.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migration_applied
-- The versions already applied, or none when leaseq was never installed.
SELECT version, name FROM leaseq.schema_migrations ORDER BY version;

-- name: migration_record
-- Records one applied migration.
INSERT INTO leaseq.schema_migrations (version, name) VALUES (%(version)s, %(name)s);

-- name: migration_schema_exists
-- Whether the leaseq.schema_migrations table exists.
SELECT to_regclass('leaseq.schema_migrations') IS NOT NULL AS present;

-- name: migration_server
-- The server's version (leaseq needs PostgreSQL 15 or later) and the database's character encoding (leaseq needs UTF8: with SQL_ASCII every text value reads back as bytes).
SELECT current_setting('server_version_num')::int AS version_num,
       current_setting('server_version') AS version,
       current_setting('server_encoding') AS encoding;

-- name: grants_apply
-- Grants each component's database role exactly its privileges on leaseq's objects (revoking everything first; NULL: no role); returns every statement run.
SELECT statement FROM leaseq.apply_grants(%(worker)s, %(operator)s, %(producer)s) AS statement;

-- name: grants_reapply
-- Grants the roles an earlier `leaseq migrate` registered (leaseq.component_roles; a dropped role counts as none) exactly this version's privileges, as grants_apply would; returns every statement run, none when no role is registered.
SELECT statement
  FROM leaseq.apply_grants(
           (SELECT r.role_oid::regrole FROM leaseq.component_roles r JOIN pg_roles p ON p.oid = r.role_oid
             WHERE r.component = 'worker'),
           (SELECT r.role_oid::regrole FROM leaseq.component_roles r JOIN pg_roles p ON p.oid = r.role_oid
             WHERE r.component = 'operator'),
           (SELECT r.role_oid::regrole FROM leaseq.component_roles r JOIN pg_roles p ON p.oid = r.role_oid
             WHERE r.component = 'producer')) AS statement
 WHERE EXISTS (SELECT 1 FROM leaseq.component_roles);
