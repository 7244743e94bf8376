-- A job's phase: what the partial indexes of forge.jobs_live name instead of its state, so
-- that a claim - a running job's state, node, attempt and times - changes no indexed value and
-- is a HOT update (issue 35, docs/src/experiments.md, "claims that write no index entry"):
--
--   phase = 'ready'     available, or running after a claim of forge.jobs_step: its lane's
--                       list (forge.job_lanes.running) names it until it ends
--   phase = 'busy'      running, in no list: running at this migration, or made running by
--                       other means from any state but available (an operator's SQL, a test
--                       kit's job, which sets it); jobs_busy finds it. (A job written from
--                       available to running by hand keeps 'ready' and is in no list: no
--                       rescue finds it. Only a claim may do that.)
--   phase = state       every other state (pending, scheduled, retryable, dead, cancelled,
--                       completed)
--
-- So no index names a running job's node: a node's running jobs are the ones its lanes' lists
-- and jobs_busy name that read 'running' on that node (forge.jobs_running). The trigger of
-- forge.jobs_phase keeps the phase at every insert into forge.jobs_live and every write of a
-- state, whoever writes it; FORGE's hot writers set it themselves, so that it does not run
-- there. Completed jobs in forge.jobs_done keep the default, 'completed' (no index there names
-- it).
ALTER TABLE forge.jobs ADD COLUMN phase text NOT NULL DEFAULT 'completed';
UPDATE forge.jobs_live SET phase = CASE state WHEN 'available' THEN 'ready' WHEN 'running' THEN 'busy'
                                        ELSE state END;
-- A lane's running jobs that are not busy (forge.jobs_step writes it; forge.jobs_reconcile
-- rebuilds it): at every commit a superset of them, so it may name jobs that ended since.
ALTER TABLE forge.job_lanes ADD COLUMN running bigint[] NOT NULL DEFAULT '{}';
-- The orphans of the lane that its last reconciliation could not lock (another transaction
-- held them): running, not held by the worker, so each claim keeps them in the list until the
-- next reconciliation settles them.
ALTER TABLE forge.job_lanes ADD COLUMN unsettled bigint[] NOT NULL DEFAULT '{}';

-- The partial indexes that named the state, on the phase: claims, promotion (due scheduled
-- jobs and retries), the queue figures' dead and pending jobs, and pruning of finished ones.
-- jobs_running gives way to jobs_busy (the node of a listed job is read from the heap).
DROP INDEX forge.jobs_running, forge.jobs_claim, forge.jobs_claim_role, forge.jobs_due,
           forge.jobs_finished, forge.jobs_dead, forge.jobs_pending;
CREATE INDEX jobs_claim ON forge.jobs_live (namespace, queue, priority, run_at, id) INCLUDE (kind)
    WHERE phase = 'ready' AND role IS NULL;
CREATE INDEX jobs_claim_role ON forge.jobs_live (namespace, role, queue, priority, run_at, id)
    INCLUDE (kind) WHERE phase = 'ready' AND role IS NOT NULL;
CREATE INDEX jobs_due ON forge.jobs_live (namespace, run_at) INCLUDE (queue, kind, phase)
    WHERE phase IN ('scheduled', 'retryable');
CREATE INDEX jobs_finished ON forge.jobs_live (namespace, phase, finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_dead ON forge.jobs_live (namespace, queue, kind) INCLUDE (run_at)
    WHERE phase = 'dead';
CREATE INDEX jobs_pending ON forge.jobs_live (namespace, queue, kind) INCLUDE (run_at)
    WHERE phase = 'pending';
CREATE INDEX jobs_busy ON forge.jobs_live (namespace, id) WHERE phase = 'busy';
-- Room on each page for a claim's new version next to the old one: a HOT update needs it on the
-- same page (at 50, 12 % of the claims found none and were not HOT, measured). New pages only;
-- pages written before keep theirs until their jobs end.
ALTER TABLE forge.jobs_live SET (fillfactor = 40);

-- The trigger, when its function exists already (its file was applied before this migration);
-- otherwise its file creates it (see it).
DO $do$
BEGIN
    IF to_regprocedure('forge.jobs_phase()') IS NOT NULL THEN
        DROP TRIGGER IF EXISTS jobs_phase ON forge.jobs_live;
        CREATE TRIGGER jobs_phase
            BEFORE INSERT OR UPDATE OF state, phase ON forge.jobs_live
            FOR EACH ROW
            WHEN (NEW.phase IS DISTINCT FROM CASE NEW.state WHEN 'available' THEN 'ready'
                                                            WHEN 'running' THEN 'busy'
                                                            ELSE NEW.state END
                  AND NOT (NEW.state = 'running' AND NEW.phase = 'ready'))
            EXECUTE FUNCTION forge.jobs_phase();
    END IF;
END
$do$;
