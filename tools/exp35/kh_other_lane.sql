-- KH with a second node's 512 claims at the head of the queue (its claims ahead): every claim
-- of this lane walks past them (a heap visit each, claimed_by set), and they stay unclaimed here.
CREATE FUNCTION exp.other_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.claimed_by := 'other'; RETURN NEW; END $$;
CREATE TRIGGER other_claims BEFORE INSERT ON forge.jobs_live
    FOR EACH ROW WHEN (NEW.id <= 512) EXECUTE FUNCTION exp.other_claims();
