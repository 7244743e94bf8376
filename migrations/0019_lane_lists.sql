-- A lane's list (forge.job_lanes.running, 0016) is rewritten whole by each claim: the jobs its
-- worker holds, up to a few hundred while it claims ahead. Past about 250 ids the array no
-- longer fits in its row and PostgreSQL compresses it at every write, by default with pglz:
-- 0.5 to 1 ms per claim for 500 to 1,000 ids, measured as the job_lanes update of a claim in a
-- one-node drain (auto_explain), which the worker's one claim at a time waits for. lz4 does the
-- same in about a third of the time; a server built without lz4 (or older than 14, which cannot
-- choose) stores the lists out of line uncompressed instead, as fast but with twice the WAL.
-- Only values written from now on are affected; each claim writes its lane's list anew.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE forge.job_lanes ALTER COLUMN running SET COMPRESSION lz4, '
            'ALTER COLUMN unsettled SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    ALTER TABLE forge.job_lanes ALTER COLUMN running SET STORAGE EXTERNAL,
                                ALTER COLUMN unsettled SET STORAGE EXTERNAL;
END
$$;
