-- The drain of tools/exp35/today.sql's exp.step, as counters.sh and callgrind.sh run it: each
-- call records the previous batch as completed (kept: :keep = true, or deleted) and claims the
-- next 128, one transaction per call, until nothing is left.
DO $$
DECLARE
  ids bigint[] := '{}'; atts integer[] := '{}'; nids bigint[]; natts integer[];
BEGIN
  LOOP
    SELECT array_agg(s.id), array_agg(s.attempt) INTO nids, natts
      FROM exp.step(ids, atts, current_setting('cost33.keep')::boolean, '{}') s;
    COMMIT;
    EXIT WHEN nids IS NULL;
    ids := nids; atts := natts;
  END LOOP;
END
$$;
