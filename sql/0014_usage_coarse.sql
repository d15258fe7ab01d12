-- Coarse usage rollups (issue #18, item 6): reports fast over 14 days at any size.
--
-- usage_hourly has one row per hour × tenant × key × group × account × model: thousands
-- per hour on a busy gateway (3,200 in spec/bench/usage_bench.sh), so a 14-day report
-- that reads it, or even usage_daily, sums 50,000–1,000,000 rows of 66 measures. Most
-- reports and the capacity report do not need the tenant or the key: they are answered
-- from the same measures per hour (and per day) × group × account × model only
-- (usage_hourly_acct, usage_daily_acct: 240 rows per hour in the bench).
--
-- Kept like usage_daily, off the settlement path: tg_usage_compact (now run by the
-- reconciler's leader every 10 minutes, see tg_billing_reconcile.c) folds every hour that
-- is over into usage_hourly_acct and moves the watermark usage_acct_until (hours before
-- it are in usage_hourly_acct), and every compacted day into usage_daily_acct. A late
-- settlement (the reconciler, a spool replay) of an hour below the watermark makes the
-- batch recompute the coarse rows of the keys it touched from the fine ones, in the same
-- transaction (tg_usage_rollup, below): a settlement of the current hour — nearly all of
-- them — costs one comparison. A rebuild of a day recomputes its coarse rows too.
--
-- Reports without a tenant or key in their grouping or filters read usage_daily_acct for
-- the compacted days wholly in the range, usage_hourly_acct for the other hours below the
-- watermark and usage_hourly for the rest (the current hour, and any not compacted yet);
-- the others read usage_daily and usage_hourly as before. The capacity report always
-- reads the coarse rows.

CREATE TABLE usage_acct_until (
    one     boolean PRIMARY KEY DEFAULT true CHECK (one),
    upto    timestamptz NOT NULL
);
INSERT INTO usage_acct_until VALUES (true, '-infinity');

-- The old functions stay, renamed, and are called by the new ones.
ALTER FUNCTION tg_usage_rollup(tg_settle_element[]) RENAME TO tg_usage_rollup_fine;
ALTER FUNCTION tg_usage_rebuild_day(date) RENAME TO tg_usage_rebuild_day_fine;
ALTER FUNCTION tg_usage_compact() RENAME TO tg_usage_compact_days;
DROP FUNCTION tg_usage_report(timestamptz, timestamptz, text[], bigint, bigint, bigint, bigint, text, int, int, text);
DROP FUNCTION tg_usage_capacity(timestamptz, timestamptz, text, int);

DO $gen$
DECLARE
    -- the measures of usage_hourly, in order (requests .. ttft_sum_ms, h0 .. h47)
    names text := (SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
                   WHERE attrelid = 'usage_hourly'::regclass AND attnum > 0 AND NOT attisdropped
                     AND attname NOT IN ('hour', 'tenant_id', 'api_key_id', 'group_id', 'account_id', 'model'));
    cols text := (SELECT string_agg(format('%I %s NOT NULL DEFAULT 0', attname, format_type(atttypid, atttypmod)), ', '
                                    ORDER BY attnum) FROM pg_attribute
                  WHERE attrelid = 'usage_hourly'::regclass AND attnum > 0 AND NOT attisdropped
                    AND attname NOT IN ('hour', 'tenant_id', 'api_key_id', 'group_id', 'account_id', 'model'));
    sums text;
    repl text;
    hist text := (SELECT string_agg(format('sum(h%s)', k), ', ' ORDER BY k) FROM generate_series(0, 47) k);
    hcols text := (SELECT string_agg(format('h%s', k), ', ' ORDER BY k) FROM generate_series(0, 47) k);
BEGIN
    SELECT string_agg(format('sum(%s)', x), ', '), string_agg(format('%s = EXCLUDED.%s', x, x), ', ')
    INTO sums, repl FROM unnest(string_to_array(names, ', ')) x;

    EXECUTE format('CREATE TABLE usage_hourly_acct (hour timestamptz NOT NULL, group_id bigint NOT NULL, '
                   'account_id bigint NOT NULL, model text NOT NULL, %s, PRIMARY KEY (hour, group_id, account_id, model))', cols);
    EXECUTE format('CREATE TABLE usage_daily_acct (day date NOT NULL, group_id bigint NOT NULL, '
                   'account_id bigint NOT NULL, model text NOT NULL, %s, PRIMARY KEY (day, group_id, account_id, model))', cols);

    -- The coarse rows of hours [lo, hi) and of the compacted days among [dlo, dhi)
    -- recomputed from the fine ones (only the keys in `p_only`, when given: a late batch's).
    -- The caller holds the rollups' lock.
    EXECUTE format($f$
        CREATE FUNCTION tg_usage_acct_refresh(lo timestamptz, hi timestamptz, dlo date, dhi date,
                                              p_only jsonb DEFAULT NULL) RETURNS void LANGUAGE plpgsql AS $body$
        BEGIN
            IF p_only IS NULL THEN
                DELETE FROM usage_hourly_acct WHERE hour >= lo AND hour < hi;
                INSERT INTO usage_hourly_acct (hour, group_id, account_id, model, %1$s)
                SELECT hour, group_id, account_id, model, %2$s FROM usage_hourly
                WHERE hour >= lo AND hour < hi GROUP BY 1, 2, 3, 4;
                DELETE FROM usage_daily_acct WHERE day >= dlo AND day < dhi;
                INSERT INTO usage_daily_acct (day, group_id, account_id, model, %1$s)
                SELECT day, group_id, account_id, model, %2$s FROM usage_daily
                WHERE day >= dlo AND day < dhi AND day IN (SELECT day FROM usage_days_compacted) GROUP BY 1, 2, 3, 4;
                RETURN;
            END IF;
            -- p_only: [{"h": hour, "g": group, "a": account, "m": model}]
            INSERT INTO usage_hourly_acct AS x (hour, group_id, account_id, model, %1$s)
            SELECT u.hour, u.group_id, u.account_id, u.model, %2$s
            FROM usage_hourly u
            JOIN (SELECT DISTINCT (e->>'h')::timestamptz AS h, (e->>'g')::bigint AS g, (e->>'a')::bigint AS a, e->>'m' AS m
                  FROM jsonb_array_elements(p_only) e) k ON u.hour = k.h AND u.group_id = k.g AND u.account_id = k.a AND u.model = k.m
            WHERE u.hour >= lo AND u.hour < hi
            GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
            ON CONFLICT (hour, group_id, account_id, model) DO UPDATE SET %3$s;
            INSERT INTO usage_daily_acct AS x (day, group_id, account_id, model, %1$s)
            SELECT u.day, u.group_id, u.account_id, u.model, %2$s
            FROM usage_daily u
            JOIN (SELECT DISTINCT (((e->>'h')::timestamptz) AT TIME ZONE 'UTC')::date AS d, (e->>'g')::bigint AS g,
                         (e->>'a')::bigint AS a, e->>'m' AS m
                  FROM jsonb_array_elements(p_only) e) k ON u.day = k.d AND u.group_id = k.g AND u.account_id = k.a AND u.model = k.m
            WHERE u.day >= dlo AND u.day < dhi AND u.day IN (SELECT day FROM usage_days_compacted)
            GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
            ON CONFLICT (day, group_id, account_id, model) DO UPDATE SET %3$s;
        END $body$
    $f$, names, sums, repl);

    -- The report (as in 0010_rollups.sql), reading the coarse rows when it can.
    EXECUTE format($f$
        CREATE FUNCTION tg_usage_report(p_from timestamptz, p_to timestamptz, p_group text[], p_tenant bigint,
                                        p_key bigint, p_group_id bigint, p_account bigint, p_model text,
                                        p_limit int, p_offset int, fmt text DEFAULT 'json')
        RETURNS text LANGUAGE plpgsql STABLE AS $body$
        DECLARE
            cdays date[] := '{}';
            uhours timestamptz[];   -- hours read from usage_hourly
            ahours timestamptz[] := '{}';   -- hours read from usage_hourly_acct
            coarse boolean := p_tenant IS NULL AND p_key IS NULL AND NOT ('tenant' = ANY (p_group)) AND NOT ('key' = ANY (p_group));
            upto timestamptz := CASE WHEN coarse THEN (SELECT u.upto FROM usage_acct_until u) ELSE '-infinity' END;
            keys text := '';      -- the group columns, for GROUP BY / ORDER BY
            skeys text := '';     -- the same, selected (the hour or day as t)
            jkeys text := '';     -- their JSON members
            ckeys text := '';     -- their CSV fields
            chead text := '';
            g text;
            filt text := ' AND ($3 IS NULL OR tenant_id = $3) AND ($4 IS NULL OR api_key_id = $4) AND ($5 IS NULL OR '
                         'group_id = $5) AND ($6 IS NULL OR account_id = $6) AND ($7 IS NULL OR model = $7)';
            afilt text := ' AND ($5 IS NULL OR group_id = $5) AND ($6 IS NULL OR account_id = $6) AND ($7 IS NULL OR model = $7)';
            src text;
            q text;
            out text;
        BEGIN
            IF NOT 'hour' = ANY (p_group) THEN
                cdays := ARRAY(SELECT day FROM usage_days_compacted
                               WHERE day::timestamp AT TIME ZONE 'UTC' >= p_from
                                 AND (day + 1)::timestamp AT TIME ZONE 'UTC' <= p_to ORDER BY day);
            END IF;
            uhours := ARRAY(SELECT h FROM generate_series(p_from, p_to - interval '1 hour', interval '1 hour') h
                            WHERE NOT (h AT TIME ZONE 'UTC')::date = ANY (cdays) AND h >= upto);
            IF coarse THEN
                ahours := ARRAY(SELECT h FROM generate_series(p_from, least(p_to, upto) - interval '1 hour', interval '1 hour') h
                                WHERE NOT (h AT TIME ZONE 'UTC')::date = ANY (cdays));
                src := 'SELECT hour AS t, NULL::bigint AS tenant_id, NULL::bigint AS api_key_id, group_id, account_id, '
                       'model, %%2$s FROM usage_hourly_acct WHERE hour = ANY ($10)' || afilt ||
                       ' UNION ALL SELECT hour, %%1$s, %%2$s FROM usage_hourly WHERE hour = ANY ($1)' || filt ||
                       ' UNION ALL SELECT day::timestamp AT TIME ZONE ''UTC'', NULL::bigint, NULL::bigint, group_id, '
                       'account_id, model, %%2$s FROM usage_daily_acct WHERE day = ANY ($2)' || afilt;
            ELSE
                src := 'SELECT hour AS t, %%1$s, %%2$s FROM usage_hourly WHERE hour = ANY ($1)' || filt ||
                       ' UNION ALL SELECT day::timestamp AT TIME ZONE ''UTC'', %%1$s, %%2$s FROM usage_daily WHERE day = ANY ($2)' ||
                       filt;
            END IF;
            FOREACH g IN ARRAY p_group LOOP
                keys := keys || CASE g WHEN 'hour' THEN 't' WHEN 'day' THEN 'date_trunc(''day'', t, ''UTC'')'
                                       WHEN 'tenant' THEN 'tenant_id' WHEN 'key' THEN 'api_key_id'
                                       WHEN 'group' THEN 'group_id' WHEN 'account' THEN 'account_id'
                                       ELSE 'model' END || ', ';
                skeys := skeys || CASE g WHEN 'hour' THEN 't' WHEN 'day' THEN 'date_trunc(''day'', t, ''UTC'') AS t'
                                         WHEN 'tenant' THEN 'tenant_id' WHEN 'key' THEN 'api_key_id'
                                         WHEN 'group' THEN 'group_id' WHEN 'account' THEN 'account_id'
                                         ELSE 'model' END || ', ';
                jkeys := jkeys || CASE g
                    WHEN 'hour' THEN '''hour'', to_char(t AT TIME ZONE ''UTC'', ''YYYY-MM-DD"T"HH24:MI:SS"Z"''), '
                    WHEN 'day' THEN '''day'', to_char(t AT TIME ZONE ''UTC'', ''YYYY-MM-DD''), '
                    WHEN 'tenant' THEN '''tenant_id'', tenant_id, ' WHEN 'key' THEN '''api_key_id'', api_key_id, '
                    WHEN 'group' THEN '''group_id'', nullif(group_id, 0), '
                    WHEN 'account' THEN '''account_id'', nullif(account_id, 0), ' ELSE '''model'', model, ' END;
                -- A model name is the client's text: quoted, and defused for spreadsheets
                -- (a leading = + - @ tab or CR gets a ' in front, OWASP's CSV injection rule).
                ckeys := ckeys || CASE g
                    WHEN 'hour' THEN 'to_char(t AT TIME ZONE ''UTC'', ''YYYY-MM-DD"T"HH24:MI:SS"Z"'')'
                    WHEN 'day' THEN 'to_char(t AT TIME ZONE ''UTC'', ''YYYY-MM-DD'')'
                    WHEN 'tenant' THEN 'tenant_id::text' WHEN 'key' THEN 'api_key_id::text'
                    WHEN 'group' THEN 'coalesce(nullif(group_id, 0)::text, '''')'
                    WHEN 'account' THEN 'coalesce(nullif(account_id, 0)::text, '''')'
                    ELSE '''"'' || CASE WHEN left(model, 1) IN (''='', ''+'', ''-'', ''@'', chr(9), chr(13)) THEN '''''''' '
                         'ELSE '''' END || replace(model, ''"'', ''""'') || ''"''' END || ' || '','' || ';
                chead := chead || CASE g WHEN 'tenant' THEN 'tenant_id' WHEN 'key' THEN 'api_key_id'
                                         WHEN 'group' THEN 'group_id' WHEN 'account' THEN 'account_id' ELSE g END || ',';
            END LOOP;
            q := 'WITH src AS (' || src || '), r AS (SELECT ' || skeys || 'sum(requests) AS requests, sum(successes) AS successes, '
                 'sum(err_429) AS e429, sum(err_5xx) AS e5xx, sum(err_timeout) AS etimeout, '
                 'sum(err_client_gone) AS egone, sum(err_other) AS eother, sum(estimated) AS estimated, '
                 'sum(input_tokens) AS ti, sum(output_tokens) AS tout, sum(cache_read_tokens) AS tcr, '
                 'sum(cache_write_tokens) AS tcw, sum(reasoning_tokens) AS tr, sum(cost) AS cost, '
                 'sum(list_value) AS list_value, sum(busy_ms) AS busy_ms, sum(ttft_n) AS ttft_n, '
                 'sum(ttft_sum_ms) AS ttft_sum, ARRAY[%%3$s] AS hist FROM src ' ||
                 CASE WHEN keys = '' THEN 'HAVING count(*) > 0' ELSE 'GROUP BY ' || rtrim(keys, ', ') || ' ORDER BY ' || rtrim(keys, ', ') END ||
                 ' LIMIT $8 + 1 OFFSET $9)';
            IF fmt = 'csv' THEN
                q := q || ' SELECT coalesce(string_agg(' || ckeys || 'requests || '','' || successes || '','' || e429 || '','' || '
                     'e5xx || '','' || etimeout || '','' || egone || '','' || eother || '','' || estimated || '','' || ti || '','' || '
                     'tout || '','' || tcr || '','' || tcw || '','' || tr || '','' || cost || '','' || list_value || '','' || '
                     'round(busy_ms::numeric, 3) || '','' || ttft_n || '','' || coalesce(round(tg_ttft_quantile(hist, 0.5)::numeric, 1)::text, '''') '
                     '|| '','' || coalesce(round(tg_ttft_quantile(hist, 0.95)::numeric, 1)::text, '''') || chr(10), '''' '
                     'ORDER BY rn), '''') FROM (SELECT *, row_number() OVER () AS rn FROM r) x WHERE rn <= $8';
                EXECUTE format(q, %1$L, %2$L, %3$L) INTO out USING uhours, cdays, p_tenant, p_key, p_group_id, p_account,
                    p_model, p_limit, p_offset, ahours;
                IF p_offset = 0 THEN
                    out := chead || 'requests,successes,err_429,err_5xx,err_timeout,err_client_gone,err_other,estimated,'
                           'input_tokens,output_tokens,cache_read_tokens,cache_write_tokens,reasoning_tokens,cost,'
                           'list_value,busy_ms,ttft_n,ttft_p50_ms,ttft_p95_ms' || chr(10) || out;
                END IF;
                RETURN out;
            END IF;
            q := q || ' SELECT json_build_object(''data'', coalesce(json_agg(json_build_object(' || jkeys ||
                 '''requests'', requests, ''successes'', successes, ''success_rate'', CASE WHEN requests > 0 THEN '
                 'round(successes::numeric / requests, 4) END, ''errors'', json_build_object(''429'', e429, ''5xx'', '
                 'e5xx, ''timeout'', etimeout, ''client_gone'', egone, ''other'', eother), ''estimated'', estimated, '
                 '''tokens'', json_build_object(''input'', ti, ''output'', tout, ''cache_read'', tcr, ''cache_write'', '
                 'tcw, ''reasoning'', tr), ''cost'', cost, ''list_value'', list_value, ''busy_ms'', round(busy_ms::numeric, 3), '
                 '''ttft'', json_build_object(''n'', ttft_n, ''mean_ms'', round((ttft_sum / nullif(ttft_n, 0))::numeric, 1), '
                 '''p50_ms'', round(tg_ttft_quantile(hist, 0.5)::numeric, 1), ''p95_ms'', '
                 'round(tg_ttft_quantile(hist, 0.95)::numeric, 1))) ORDER BY rn) FILTER (WHERE rn <= $8), ''[]''), '
                 '''has_more'', count(*) > $8)::text FROM (SELECT *, row_number() OVER () AS rn FROM r) x';
            EXECUTE format(q, %1$L, %2$L, %3$L) INTO out USING uhours, cdays, p_tenant, p_key, p_group_id, p_account,
                p_model, p_limit, p_offset, ahours;
            RETURN out;
        END $body$
    $f$, 'tenant_id, api_key_id, group_id, account_id, model', names, hist);

    -- The capacity report (as in 0010_rollups.sql), from the coarse rows: usage_daily_acct
    -- for the compacted days wholly in the range, usage_hourly_acct for the other hours
    -- below the watermark, usage_hourly for the rest; time in flight per hour from
    -- usage_capacity_hourly (compacted days) and usage_hourly_acct / usage_hourly. Every
-- account (or group) is listed, idle ones with zeros.
    EXECUTE format($f$
        CREATE FUNCTION tg_usage_capacity(p_from timestamptz, p_to timestamptz, p_by text, p_window_hours int DEFAULT 5)
        RETURNS text LANGUAGE plpgsql STABLE AS $body$
        DECLARE
            cdays date[];
            upto timestamptz := (SELECT u.upto FROM usage_acct_until u);
            uhours timestamptz[];
            ahours timestamptz[];
            nhours int := round(extract(epoch FROM p_to - p_from) / 3600);
            out text;
        BEGIN
            cdays := ARRAY(SELECT day FROM usage_days_compacted WHERE day::timestamp AT TIME ZONE 'UTC' >= p_from
                           AND (day + 1)::timestamp AT TIME ZONE 'UTC' <= p_to ORDER BY day);
            uhours := ARRAY(SELECT h FROM generate_series(greatest(p_from, upto), p_to - interval '1 hour', interval '1 hour') h
                            WHERE NOT (h AT TIME ZONE 'UTC')::date = ANY (cdays));
            ahours := ARRAY(SELECT h FROM generate_series(p_from, least(p_to, upto) - interval '1 hour', interval '1 hour') h
                            WHERE NOT (h AT TIME ZONE 'UTC')::date = ANY (cdays));
            WITH cap AS (
                SELECT hour, account_id, group_id, busy_ms, tokens FROM usage_capacity_hourly
                WHERE hour >= p_from AND hour < p_to AND (hour AT TIME ZONE 'UTC')::date = ANY (cdays)
                UNION ALL
                SELECT hour, account_id, group_id, sum(busy_ms),
                       sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens)
                FROM usage_hourly_acct WHERE hour = ANY (ahours) GROUP BY 1, 2, 3
                UNION ALL
                SELECT hour, account_id, group_id, sum(busy_ms),
                       sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens)
                FROM usage_hourly WHERE hour = ANY (uhours) GROUP BY 1, 2, 3),
            src AS (
                SELECT account_id, group_id, requests, successes, err_429, list_value, cost, busy_ms, %1$s
                FROM usage_hourly WHERE hour = ANY (uhours)
                UNION ALL
                SELECT account_id, group_id, requests, successes, err_429, list_value, cost, busy_ms, %1$s
                FROM usage_hourly_acct WHERE hour = ANY (ahours)
                UNION ALL
                SELECT account_id, group_id, requests, successes, err_429, list_value, cost, busy_ms, %1$s
                FROM usage_daily_acct WHERE day = ANY (cdays)),
            tot AS (
                SELECT CASE WHEN p_by = 'group' THEN group_id ELSE account_id END AS id, sum(requests) AS req,
                       sum(successes) AS ok, sum(err_429) AS e429, sum(list_value) AS val, sum(cost) AS cost,
                       sum(busy_ms) AS busy, ARRAY[%2$s] AS hist
                FROM src GROUP BY 1),
            -- every account (or group), idle ones too: idle capacity is part of the plan
            every AS (
                SELECT i.id, coalesce(t.req, 0) AS req, coalesce(t.ok, 0) AS ok, coalesce(t.e429, 0) AS e429,
                       coalesce(t.val, 0) AS val, coalesce(t.cost, 0) AS cost, coalesce(t.busy, 0) AS busy, t.hist
                FROM (SELECT id FROM tot UNION SELECT x.id FROM accounts x WHERE p_by = 'account'
                      UNION SELECT x.id FROM groups x WHERE p_by = 'group') i
                LEFT JOIN tot t ON t.id = i.id),
            ph AS (
                SELECT CASE WHEN p_by = 'group' THEN group_id ELSE account_id END AS id, hour,
                       sum(busy_ms) / 3600000.0 AS inflight, sum(tokens) AS tokens
                FROM cap GROUP BY 1, 2),
            pk AS (
                SELECT t.id, percentile_cont(0.95) WITHIN GROUP (ORDER BY coalesce(ph.inflight, 0)) AS p95,
                       max(coalesce(ph.inflight, 0)) AS mx
                FROM every t CROSS JOIN generate_series(p_from, p_to - interval '1 hour', interval '1 hour') h
                LEFT JOIN ph ON ph.id = t.id AND ph.hour = h
                GROUP BY t.id),
            win AS (
                SELECT w.id, count(*) AS used, max(w.tokens) AS peak, round(avg(w.tokens)) AS mean
                FROM (SELECT id, floor(extract(epoch FROM hour) / (p_window_hours * 3600)) AS wn, sum(tokens) AS tokens
                      FROM ph GROUP BY 1, 2) w GROUP BY w.id),
            ent AS (
                SELECT t.*, pk.p95, pk.mx, win.used, win.peak, win.mean,
                       a.name, a.kind, a.status, a.concurrency,
                       g.name AS gname,
                       (SELECT sum(x.concurrency) FROM accounts x JOIN account_groups ag ON ag.account_id = x.id
                        WHERE ag.group_id = t.id AND x.status = 'active') AS gcap,
                       (SELECT CASE WHEN bool_and(k.concurrency IS NOT NULL) THEN sum(k.concurrency) END
                        FROM api_keys k WHERE k.group_id = t.id AND k.status = 'active') AS sold
                FROM every t JOIN pk ON pk.id = t.id LEFT JOIN win ON win.id = t.id
                LEFT JOIN accounts a ON p_by = 'account' AND a.id = t.id
                LEFT JOIN groups g ON p_by = 'group' AND g.id = t.id)
            SELECT json_build_object(
                'from', p_from, 'to', p_to, 'hours', nhours, 'by', p_by,
                'rule', CASE WHEN p_by = 'group'
                    THEN 'recommended_oversubscription = sold_concurrency / max(1, 1.25 x in_flight.p95): how many times the '
                         'concurrency of its active accounts the concurrency sold on its keys may be while the P95 hour of '
                         'the range still fits with 25%% headroom (null when a key has no concurrency limit); in_flight is '
                         'the mean number of requests in flight over each hour (time in flight / 3600 s), P95 over every '
                         'hour of the range, idle hours included'
                    ELSE 'recommended_concurrency = max(1, ceil(1.25 x in_flight.p95)); when share_429 >= 0.02 (the '
                         'provider already refuses), at most max(1, floor(0.8 x concurrency)); in_flight is the mean '
                         'number of requests in flight over each hour (time in flight / 3600 s), P95 over every hour of '
                         'the range, idle hours included' END,
                'basis_ok', nhours >= 7 * 24,
                'ttft_error', 'P95 TTFT within +-9.1%% (fixed log buckets, 4 per doubling from 20 ms to 57.9 s)',
                'data', coalesce(json_agg(json_build_object(
                    CASE WHEN p_by = 'group' THEN 'group_id' ELSE 'account_id' END, nullif(e.id, 0),
                    'name', coalesce(e.name, e.gname),
                    'kind', e.kind, 'status', e.status,
                    'concurrency', CASE WHEN p_by = 'group' THEN e.gcap ELSE e.concurrency END,
                    'requests', e.req, 'successes', e.ok,
                    'success_rate', CASE WHEN e.req > 0 THEN round(e.ok::numeric / e.req, 4) END,
                    'share_429', CASE WHEN e.req > 0 THEN round(e.e429::numeric / e.req, 4) END,
                    'list_value', e.val, 'cost', e.cost,
                    'ttft_p95_ms', round(tg_ttft_quantile(e.hist, 0.95)::numeric, 1),
                    'ttft_p50_ms', round(tg_ttft_quantile(e.hist, 0.5)::numeric, 1),
                    'in_flight', json_build_object('p95', round(e.p95::numeric, 3), 'max', round(e.mx::numeric, 3),
                                                   'mean', round((e.busy / 3600000.0 / greatest(nhours, 1))::numeric, 3)),
                    'utilisation', CASE WHEN coalesce(CASE WHEN p_by = 'group' THEN e.gcap ELSE e.concurrency END, 0) > 0
                        THEN round((e.busy / (nhours * 3600000.0 * CASE WHEN p_by = 'group' THEN e.gcap
                                                                         ELSE e.concurrency END))::numeric, 4) END,
                    'reset_windows', CASE WHEN e.kind = 'subscription' THEN json_build_object(
                        'window_hours', p_window_hours, 'windows', ceil(nhours::numeric / p_window_hours),
                        'used', coalesce(e.used, 0), 'peak_tokens', coalesce(e.peak, 0), 'mean_tokens', coalesce(e.mean, 0)) END,
                    'recommended_concurrency', CASE WHEN p_by = 'account' AND e.id <> 0 THEN
                        CASE WHEN e.req > 0 AND e.e429::numeric / e.req >= 0.02
                             THEN least(greatest(1, ceil(1.25 * e.p95))::int, greatest(1, floor(0.8 * e.concurrency))::int)
                             ELSE greatest(1, ceil(1.25 * e.p95))::int END END,
                    'sold_concurrency', CASE WHEN p_by = 'group' THEN e.sold END,
                    'oversubscription', CASE WHEN p_by = 'group' AND e.gcap > 0 THEN round(e.sold::numeric / e.gcap, 3) END,
                    'recommended_oversubscription', CASE WHEN p_by = 'group' AND e.gcap > 0 THEN
                        round(e.sold::numeric / greatest(1.25 * e.p95, 1)::numeric, 3) END)
                    ORDER BY e.id), '[]'))::text
            INTO out FROM ent e;
            RETURN out;
        END $body$
    $f$, hcols, hist);
END $gen$;

-- The batch's rollups: the fine ones (0010), then, only when the batch settles an hour
-- below the watermark (late), the coarse rows of the keys it touched, recomputed.
CREATE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    upto timestamptz;
    late jsonb;
BEGIN
    PERFORM tg_usage_rollup_fine(won);
    IF cardinality(won) = 0 THEN
        RETURN;
    END IF;
    upto := (SELECT u.upto FROM usage_acct_until u);
    SELECT jsonb_agg(DISTINCT jsonb_build_object('h', h, 'g', coalesce(w.group_id, 0), 'a', coalesce(w.account_id, 0),
                                                 'm', w.model))
    INTO late
    FROM unnest(won) w, LATERAL (SELECT tg_usage_hour(tg_request_started(w.request_id), now()) AS h) x
    WHERE x.h < upto;
    IF late IS NOT NULL THEN
        PERFORM tg_usage_acct_refresh('-infinity', upto, '-infinity', 'infinity', late);
    END IF;
END $$;

-- A day's rollups recomputed (0010), its coarse rows with them.
CREATE FUNCTION tg_usage_rebuild_day(d date) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    n bigint := tg_usage_rebuild_day_fine(d);
    upto timestamptz := (SELECT u.upto FROM usage_acct_until u);
BEGIN
    PERFORM tg_usage_acct_refresh(d::timestamp AT TIME ZONE 'UTC',
                                  least((d + 1)::timestamp AT TIME ZONE 'UTC', upto), d, d + 1);
    RETURN n;
END $$;

-- The compaction, run by the reconciler's leader every 10 minutes (and by hand): the
-- hours that are over folded into usage_hourly_acct (the watermark moves to the current
-- hour), then the days that are over into usage_daily (0010) and usage_daily_acct.
-- Returns the hours and days compacted.
CREATE FUNCTION tg_usage_compact() RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    cur timestamptz := date_trunc('hour', now(), 'UTC');
    today date := (now() AT TIME ZONE 'UTC')::date;
    upto timestamptz := (SELECT u.upto FROM usage_acct_until u);
    lo timestamptz;
    done int := 0;
    d date;
BEGIN
    IF upto < cur THEN
        LOCK TABLE usage_hourly, usage_daily, usage_capacity_hourly, usage_hourly_acct, usage_daily_acct
            IN SHARE ROW EXCLUSIVE MODE;
        upto := (SELECT u.upto FROM usage_acct_until u);
        lo := least(greatest(upto, coalesce((SELECT min(hour) FROM usage_hourly), cur)), cur);
        PERFORM tg_usage_acct_refresh(lo, cur, 'infinity', 'infinity');
        UPDATE usage_acct_until SET upto = cur;
        done := done + greatest(0, extract(epoch FROM cur - lo) / 3600)::int;
    END IF;
    -- the days that are over and not compacted yet: each probed by its hours (an index
    -- range each), from the day after the newest compacted one, or the oldest hour
    FOR d IN SELECT g::date FROM generate_series(
                 coalesce((SELECT max(day) + 1 FROM usage_days_compacted),
                          (SELECT (min(hour) AT TIME ZONE 'UTC')::date FROM usage_hourly), today),
                 today - 1, interval '1 day') g LOOP
        IF EXISTS (SELECT 1 FROM usage_hourly WHERE hour >= d::timestamp AT TIME ZONE 'UTC'
                   AND hour < (d + 1)::timestamp AT TIME ZONE 'UTC') THEN
            done := done + tg_usage_compact_days();
            PERFORM tg_usage_acct_refresh('infinity', 'infinity', '-infinity', today);
            EXIT;
        END IF;
    END LOOP;
    RETURN done;
END $$;

-- What this database holds already, compacted.
SELECT tg_usage_compact();
