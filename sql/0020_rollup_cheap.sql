-- usage (#18, item 6): the settlement batch's rollup made cheap — throughput with the
-- rollups on at least 0.9× of without.
--
-- 0010's per-batch upsert (tg_usage_rollup_fine, called by 0016's tg_usage_rollup) ran
-- 66 aggregates over every settled row of the batch — 48 of them `count(*) FILTER (WHERE
-- bucket = k)` for the TTFT histogram — and computed each row's hour (its request id
-- parsed by tg_request_started) three times: for the upsert, for the compacted-days probe
-- and for the late-hours probe of 0014/0016. Now a batch is rolled up in two steps:
--
--   1. its rows grouped by hour × tenant × key × group × account × model × status class ×
--      TTFT bucket × estimated (the hour computed once per row, inline — 0010's
--      tg_usage_hour(tg_request_started(id), now()) was a SQL function call per row, not
--      inlined because its argument is used twice): a few aggregates per row;
--      a batch of 200 requests of one key and model gives a handful of groups;
--   2. those groups summed into one row per combination with the 66 measures (each
--      bucket's count a FILTER over the groups, not over the rows), kept in an array.
--
-- Then, holding usage_hourly's ROW EXCLUSIVE lock (which the upsert takes anyway; 0010's
-- batch held it before it read the watermark, so a compaction waits for the batch and
-- folds its rows), one comparison: when every hour of the batch is at or above the cubes' watermark
-- (usage_acct_until) and no day from its earliest on is compacted — a settlement of the
-- current hour, nearly all of them — the array is upserted into usage_hourly, in key
-- order (the lock order of 0010), and that is all 0010/0014/0016 did for such a batch.
-- Otherwise (a late batch: the reconciler, a spool replay) the batch goes to 0016's
-- function unchanged (renamed tg_usage_rollup_late: the fine, daily and capacity rows and
-- the cubes' rows of its combinations), so the late path is exactly what it was.
--
-- Sums are the same sums: counts and token sums are integers, cost and the list value
-- NUMERIC (exact whatever the grouping: each row's list value is computed per row, as
-- before, and summed), busy_ms and ttft_sum_ms float sums (the order of addition was
-- never fixed). tg_settle_batch is unchanged: it calls tg_usage_rollup(won) as before.

ALTER FUNCTION tg_usage_rollup(tg_settle_element[]) RENAME TO tg_usage_rollup_late;

DO $gen$
DECLARE
    -- usage_hourly's measures in column order (requests .. ttft_sum_ms, h0 .. h47)
    names text := (SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
                   WHERE attrelid = 'usage_hourly'::regclass AND attnum > 0 AND NOT attisdropped
                     AND attname NOT IN ('hour', 'tenant_id', 'api_key_id', 'group_id', 'account_id', 'model'));
    upd text;
    hist text := (SELECT string_agg(format('coalesce(sum(s.c) FILTER (WHERE s.b = %s), 0)::int', k), ', ' ORDER BY k)
                  FROM generate_series(0, 47) k);
BEGIN
    IF names <> 'requests, successes, err_429, err_5xx, err_timeout, err_client_gone, err_other, estimated, '
                 'input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, cost, '
                 'list_value, busy_ms, ttft_n, ttft_sum_ms, '
                 || (SELECT string_agg(format('h%s', k), ', ' ORDER BY k) FROM generate_series(0, 47) k) THEN
        RAISE EXCEPTION '0020: usage_hourly''s measures are not the ones this migration sums: %', names;
    END IF;
    SELECT string_agg(format('%s = x.%s + EXCLUDED.%s', x, x, x), ', ') INTO upd
    FROM unnest(string_to_array(names, ', ')) x;

    EXECUTE format($f$
        CREATE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS $body$
        DECLARE
            agg usage_hourly[];
            lo timestamptz;
        BEGIN
            IF cardinality(won) = 0 THEN
                RETURN;
            END IF;
            -- 1. grouped by combination × class × bucket × estimated, the hour computed once a row
            WITH n AS (
                -- tg_usage_hour(tg_request_started(id), now()) written out: that call is
                -- not inlined (its argument, used twice, is not a plain column), and a SQL
                -- function call a row cost more than the rest of the row's rollup
                SELECT date_trunc('hour', coalesce(nullif(tg_request_started(w.request_id), '-infinity'), now()), 'UTC')
                           AS hour, w.tenant_id, w.api_key_id,
                       coalesce(w.group_id, 0) AS g, coalesce(w.account_id, 0) AS a, w.model, w.input AS i,
                       w.output AS o, w.cache_read AS cr, w.cache_write AS cw, w.reasoning AS r, w.cost,
                       w.estimated AS est, tg_usage_class(w.status) AS k, tg_ttft_bucket(w.ttft_ms) AS b, w.ttft_ms,
                       w.total_ms
                FROM unnest(won) w),
            s AS (
                SELECT n.hour, n.tenant_id, n.api_key_id, n.g, n.a, n.model, n.k, n.b, n.est, count(*) AS c,
                       sum(n.i) AS i, sum(n.o) AS o, sum(n.cr) AS cr, sum(n.cw) AS cw, sum(n.r) AS r,
                       sum(n.cost) AS cost,
                       sum(CASE WHEN n.k = 0 THEN
                           (coalesce(n.i, 0) * p.input + (coalesce(n.o, 0) - least(coalesce(n.r, 0), coalesce(n.o, 0)))
                            * p.output + least(coalesce(n.r, 0), coalesce(n.o, 0)) * coalesce(p.reasoning, p.output)
                            + coalesce(n.cr, 0) * p.cache_read + coalesce(n.cw, 0) * p.cache_write) / 1000000 END) AS lv,
                       sum(n.total_ms) AS busy, count(n.ttft_ms) AS tn, sum(n.ttft_ms) AS ts
                FROM n LEFT JOIN model_prices p ON p.model = n.model
                GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9)
            -- 2. one row per combination with its 66 measures
            SELECT array_agg(x ORDER BY x.hour, x.tenant_id, x.api_key_id, x.group_id, x.account_id, x.model),
                   min(x.hour)
            INTO agg, lo
            FROM (SELECT s.hour, s.tenant_id, s.api_key_id, s.g, s.a, s.model, sum(s.c)::bigint,
                         coalesce(sum(s.c) FILTER (WHERE s.k = 0), 0)::bigint,
                         coalesce(sum(s.c) FILTER (WHERE s.k = 1), 0)::bigint,
                         coalesce(sum(s.c) FILTER (WHERE s.k = 2), 0)::bigint,
                         coalesce(sum(s.c) FILTER (WHERE s.k = 3), 0)::bigint,
                         coalesce(sum(s.c) FILTER (WHERE s.k = 4), 0)::bigint,
                         coalesce(sum(s.c) FILTER (WHERE s.k = 5), 0)::bigint,
                         coalesce(sum(s.c) FILTER (WHERE s.est), 0)::bigint,
                         coalesce(sum(s.i), 0)::bigint, coalesce(sum(s.o), 0)::bigint, coalesce(sum(s.cr), 0)::bigint,
                         coalesce(sum(s.cw), 0)::bigint, coalesce(sum(s.r), 0)::bigint, coalesce(sum(s.cost), 0),
                         coalesce(sum(s.lv), 0), coalesce(sum(s.busy), 0), sum(s.tn)::bigint, coalesce(sum(s.ts), 0),
                         %1$s
                  FROM s GROUP BY 1, 2, 3, 4, 5, 6) x (hour, tenant_id, api_key_id, group_id, account_id, model, %2$s);
            -- The lock the upsert takes anyway, taken before the watermark is read: a
            -- compaction (SHARE ROW EXCLUSIVE) cannot move it between the check and the upsert.
            LOCK TABLE usage_hourly IN ROW EXCLUSIVE MODE;
            -- a late batch (an hour below the cubes' watermark, or a compacted day): as before 0020
            IF lo < (SELECT u.upto FROM usage_acct_until u)
               OR EXISTS (SELECT 1 FROM usage_days_compacted c WHERE c.day >= (lo AT TIME ZONE 'UTC')::date) THEN
                PERFORM tg_usage_rollup_late(won);
                RETURN;
            END IF;
            INSERT INTO usage_hourly AS x
            SELECT (u).* FROM unnest(agg) u
            ON CONFLICT (hour, tenant_id, api_key_id, group_id, account_id, model) DO UPDATE SET %3$s;
        END $body$
    $f$, hist, names, upd);
END $gen$;
