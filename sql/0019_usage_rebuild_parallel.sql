-- `tollgate usage rebuild` on all cores (issue #18, item 6).
--
-- 0010's tg_usage_rebuild_day_fine aggregates a day's usage rows with INSERT … SELECT,
-- which Postgres never plans in parallel: one core sums the 66 measures of every row
-- (~7–9 µs a row; 100 million rows took an hour). The same aggregate now goes into a
-- temporary table by CREATE TABLE … AS, which Postgres does run with parallel workers
-- (max_parallel_workers_per_gather), and is copied into usage_hourly from there; the
-- same statement text otherwise, run after the same lock, so the same rows. The
-- function is rewritten from its own definition (the aggregate is generated in 0010),
-- and this migration fails if that definition is not the one it expects.
DO $mig$
DECLARE
    def text := pg_get_functiondef('tg_usage_rebuild_day_fine(date)'::regprocedure);
    ins text := 'INSERT INTO usage_hourly (';
    fin text := 'ORDER BY 1, 2, 3, 4, 5, 6;';
    i1 int := strpos(def, 'WITH n AS (');
    i2 int := strpos(def, ins);
    i3 int;
    cols text;
BEGIN
    IF i1 = 0 OR i2 < i1 THEN
        RAISE EXCEPTION 'tg_usage_rebuild_day_fine is not 0010''s';
    END IF;
    cols := split_part(substr(def, i2 + length(ins)), ')', 1);
    i3 := i2 + strpos(substr(def, i2), fin) - 1;
    IF i3 < i2 OR cols NOT LIKE 'hour, tenant_id, api_key_id, group_id, account_id, model, %' THEN
        RAISE EXCEPTION 'tg_usage_rebuild_day_fine is not 0010''s';
    END IF;
    EXECUTE left(def, i1 - 1)
        || format('CREATE TEMP TABLE tg_usage_rebuild_rows (%s) AS ', cols)
        || substr(def, i1, i2 - i1)
        || substr(def, i2 + length(ins) + length(cols) + 1, i3 + length(fin) - (i2 + length(ins) + length(cols) + 1))
        || format(' INSERT INTO usage_hourly (%s) SELECT * FROM tg_usage_rebuild_rows; DROP TABLE tg_usage_rebuild_rows;', cols)
        || substr(def, i3 + length(fin));
END $mig$;
