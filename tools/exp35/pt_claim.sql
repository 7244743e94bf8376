-- PT: P (s2_claim.sql and p_claim.sql, applied first) with a phase kept by a BEFORE trigger, instead of a
-- generated column: its WHEN calls the function only when a write changes the phase (an
-- insert, a state of another phase), never at a claim.
ALTER TABLE forge.jobs ALTER COLUMN phase DROP EXPRESSION;
CREATE FUNCTION exp.job_phase() RETURNS trigger LANGUAGE plpgsql AS $t$
BEGIN
    NEW.phase := CASE WHEN NEW.state IN ('available', 'running') THEN 'ready' ELSE NEW.state END;
    RETURN NEW;
END $t$;
CREATE TRIGGER jobs_phase BEFORE INSERT OR UPDATE OF state, phase ON forge.jobs_live
    FOR EACH ROW
    WHEN (NEW.phase IS DISTINCT FROM
          CASE WHEN NEW.state IN ('available', 'running') THEN 'ready' ELSE NEW.state END)
    EXECUTE FUNCTION exp.job_phase();
