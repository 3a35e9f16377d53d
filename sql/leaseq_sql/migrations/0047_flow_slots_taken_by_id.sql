-- leaseq schema: a keyed claim writes the units and buckets it locked by their ids.
--
-- The claim's UPDATE of leaseq.flow_slots named its units by three arrays (queue, key,
-- slot number) on the primary key, and its UPDATE of leaseq.flow_buckets a rated key's
-- bucket by two (queue, key). PostgreSQL 15 costs an index scan of several arrays as
-- one descent per combination of their elements (10 x 10 x 10 for a generic plan's arrays
-- of unknown length), so a worker's session planned a scan of the whole table instead and
-- read every unit at every claim: 4,000 rows at 1,000 keys with a limit of 4, and 1,000
-- buckets at 1,000 rated keys. PostgreSQL 18 used the index (17's release notes list faster
-- btree searches over several values). Each unit and each bucket now has an id of its own,
-- which never changes while the row lives, and the claim names them by one array of ids
-- each.

ALTER TABLE leaseq.flow_slots ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE leaseq.flow_slots ADD CONSTRAINT flow_slots_id_key UNIQUE (id);
ALTER TABLE leaseq.flow_buckets ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY;
ALTER TABLE leaseq.flow_buckets ADD CONSTRAINT flow_buckets_id_key UNIQUE (id);
