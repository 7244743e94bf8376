-- Keeps a job's phase (migration 0016) at every write of forge.jobs_live: 'ready' for an
-- available job, 'busy' for a running one, its state otherwise - but a running job that a
-- claim wrote 'ready' (its lane's list names it) stays so. A BEFORE trigger whose WHEN calls it
-- only when the row's phase is not one of its state's: an insert that left it to the default, a
-- state written without its phase (an operator's SQL), a phase written by hand.
CREATE OR REPLACE FUNCTION forge.jobs_phase() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.phase := CASE NEW.state WHEN 'available' THEN 'ready' WHEN 'running' THEN 'busy'
                                ELSE NEW.state END;
    RETURN NEW;
END;
$$;

-- The trigger. Its WHEN is the consistent pairs of state and phase - the phase is the state, or
-- the state and phase concatenated are one of three (no other pair of a state and a phase
-- concatenates to those) - spelled in few nodes: PostgreSQL reads a trigger's WHEN from its
-- stored node tree at each statement, at a cost that follows the number of nodes: the trigger
-- cost a one-job claim 99k instructions with this test written as a CASE, 55k so
-- (tools/exp35/one_job_callgrind.sh; a one-job enqueue pays it too).
--
-- A function file applies whatever migrations the database has (it may be applied
-- before migration 0016 adds the column), and migration 0016 cannot name this function before
-- it exists: so each creates it when the other's part is there - here when the column exists,
-- in 0016 when this function does.
DO $do$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_attribute
                WHERE attrelid = to_regclass('forge.jobs_live') AND attname = 'phase'
                  AND NOT attisdropped) THEN
        DROP TRIGGER IF EXISTS jobs_phase ON forge.jobs_live;
        CREATE TRIGGER jobs_phase
            BEFORE INSERT OR UPDATE OF state, phase ON forge.jobs_live
            FOR EACH ROW
            WHEN (NEW.phase <> NEW.state
                  AND NEW.state || NEW.phase <> ALL ('{availableready,runningready,runningbusy}'))
            EXECUTE FUNCTION forge.jobs_phase();
    END IF;
END
$do$;
