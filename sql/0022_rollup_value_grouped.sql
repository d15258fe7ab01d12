-- usage (#18, item 6): the settlement batch's list value computed once per combination,
-- not once per settled row.
--
-- 0020's tg_usage_rollup joined every settled row of a batch to model_prices and computed
-- its list value (five NUMERIC products, a sum and a division) before grouping: for a
-- batch of 200 requests of one key and model, 200 joins and a thousand NUMERIC operations
-- for one output value. Now the rows are grouped first (token sums are integers, the
-- reasoning part of each row's output — least(reasoning, output) — summed beside them) and
-- each combination's sums are priced once, after the join of its one model.
--
-- The value is the same value. Per row 0020 computed (Σ tokens × price) / 1000000: the
-- products have at most 10 decimals (prices are numeric(20, 10)), and NUMERIC division
-- keeps at least 16 significant digits, which is every digit of the exact quotient while
-- a request's list value is under 10,000 in the price's currency. Now Σ over rows of
-- tokens × price × 0.000001: a NUMERIC product is exact (its scale is the sum of its
-- factors'), so the grouped value equals the sum of the per-row ones, and a rebuild from
-- the detail rows (tg_usage_rebuild, per row as before) gives the same rollups.
-- Everything else in the function — the two steps, the watermark test, the late path —
-- is 0020's, unchanged.

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
        RAISE EXCEPTION '0022: usage_hourly''s measures are not the ones this migration sums: %', names;
    END IF;
    SELECT string_agg(format('%s = x.%s + EXCLUDED.%s', x, x, x), ', ') INTO upd
    FROM unnest(string_to_array(names, ', ')) x;

    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS $body$
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
                       sum(n.cost) AS cost, sum(least(coalesce(n.r, 0), coalesce(n.o, 0))) AS ro,
                       sum(n.total_ms) AS busy, count(n.ttft_ms) AS tn, sum(n.ttft_ms) AS ts
                FROM n
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
                         coalesce(CASE WHEN bool_or(s.k = 0) THEN (coalesce(sum(s.i) FILTER (WHERE s.k = 0), 0) * p.input
                                   + (coalesce(sum(s.o) FILTER (WHERE s.k = 0), 0)
                                      - coalesce(sum(s.ro) FILTER (WHERE s.k = 0), 0)) * p.output
                                   + coalesce(sum(s.ro) FILTER (WHERE s.k = 0), 0) * coalesce(p.reasoning, p.output)
                                   + coalesce(sum(s.cr) FILTER (WHERE s.k = 0), 0) * p.cache_read
                                   + coalesce(sum(s.cw) FILTER (WHERE s.k = 0), 0) * p.cache_write) * 0.000001 END, 0),
                         coalesce(sum(s.busy), 0), sum(s.tn)::bigint, coalesce(sum(s.ts), 0),
                         %1$s
                  FROM s LEFT JOIN model_prices p ON p.model = s.model
                  GROUP BY 1, 2, 3, 4, 5, 6, p.model) x (hour, tenant_id, api_key_id, group_id, account_id, model, %2$s);
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
