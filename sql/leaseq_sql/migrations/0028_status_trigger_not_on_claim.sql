-- leaseq schema: a claim no longer runs the status trigger's function.
--
-- jobs_on_status fired at every change of a keyed job's status, its claim too (pending to
-- running), and each of its branches then found nothing to do: a pending job that starts
-- running was not finished and is not now, is not pending any more, and has just been given
-- a lease, not lost one. Its clause now says so, and the claim of a keyed job queues no
-- trigger event and calls no function.
--
-- Counted with an instruction-counting profiler (one backend, PostgreSQL 18.6, claim and
-- completion of one job at a time, 10,000 jobs on 1,000 keys): 1,626,000 instructions per
-- job of unlimited keys before, 1,601,000 after; with a limit of 4 per key 2,151,000 and
-- 2,127,000. What each branch does is unchanged.
DROP TRIGGER jobs_on_status ON leaseq.jobs;
CREATE TRIGGER jobs_on_status AFTER UPDATE OF status ON leaseq.jobs
    FOR EACH ROW WHEN ((OLD.status <> 'pending' OR NEW.status <> 'running')
                       AND (OLD.key IS NOT NULL OR NEW.key IS NOT NULL OR OLD.ordering_key IS NOT NULL
                            OR NEW.notify_done OR NEW.has_children OR NEW.pipeline_id IS NOT NULL))
    EXECUTE FUNCTION leaseq.jobs_on_status();
