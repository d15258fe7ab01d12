-- Hourly usage rollups (issue #18, item 2): per hour × tenant × key × group × account ×
-- model, written by the settlement batch itself (tg_usage_rollup, called last by
-- tg_settle_batch: one aggregated upsert per batch, no round trip per request), and
-- rebuildable from the usage rows (tg_usage_rebuild_day, `tollgate usage rebuild`).
--
-- An hour is the hour (UTC) the request started (tg_request_started, sql/0009): a row's
-- rollup hour lies in its own day partition, so a day's rollups are rebuilt from that
-- one partition. Rows without a start (legacy ids) count in the hour they were settled.
--
-- Classes, from the status the client got (tg_usage_class): success 200–399; 429; 5xx
-- (500–599 but 504); timeout (504, 408, and 0/NULL: usage unknown, settled by the
-- reconciler — the upstream timed out or reset after the request was sent); client_gone
-- (499: the client left); other (any other status, e.g. 400). A retried request counts
-- once, with its last attempt's status and account.
--
-- TTFT: a fixed histogram of 48 buckets, log-spaced four per doubling from 20 ms: bucket
-- 0 is [0, 20 ms), bucket k (1..46) [20·2^((k-1)/4), 20·2^(k/4)) ms, bucket 47 ≥ 57.9 s.
-- Buckets add across hours, so P50/P95 of any range is read from the summed buckets: the
-- bucket holding the quantile, reported at its geometric middle, 20·2^((k-0.5)/4) ms —
-- within ±9.1% (2^(1/8)) of a value between 20 ms and 57.9 s (below 20 ms: reported as
-- 20 ms; past 57.9 s: as 57.9 s). Kept as 48 integer columns h0..h47, not an array:
-- summing columns is what makes a 14-day report fast (plain sum() aggregates).
--
-- Equivalent value: the successful requests' tokens at the list price (model_prices, no
-- group multiplier, no account cost multiplier) as it was when the batch settled
-- (rebuild: as it is now). busy_ms: the requests' time in flight (total_ms), summed.
--
-- usage_daily: the same, per UTC day, for the days that are over: tg_usage_compact
-- folds a finished day's hours into one row per combination (the reconciler, hourly);
-- from then on a late settlement of that day (the reconciler, a spool) also adds to its
-- daily row in the same batch. Reports read the daily rows of compacted days and the
-- hourly rows of the rest. A compaction or rebuild takes the rollups' lock for its day
-- (SHARE ROW EXCLUSIVE): batches wait for it, never miss it.

CREATE FUNCTION tg_usage_class(status int) RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN status BETWEEN 200 AND 399 THEN 0
                WHEN status = 429 THEN 1
                WHEN status IN (504, 408) OR status IS NULL OR status = 0 THEN 3
                WHEN status BETWEEN 500 AND 599 THEN 2
                WHEN status = 499 THEN 4
                ELSE 5 END::smallint
$$;

CREATE FUNCTION tg_ttft_bucket(ms double precision) RETURNS int LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN ms IS NULL THEN NULL WHEN ms < 20 THEN 0
                ELSE least(1 + floor(4 * ln(ms / 20) / ln(2))::int, 47) END
$$;

-- The value (ms) a quantile in bucket k is reported at.
CREATE FUNCTION tg_ttft_bucket_ms(k int) RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN k <= 0 THEN 20 WHEN k >= 47 THEN 20 * 2 ^ (46 / 4.0) ELSE 20 * 2 ^ ((k - 0.5) / 4) END
$$;

-- Quantile q (0..1) of a summed histogram (48 counts), in ms; NULL when it is empty.
CREATE FUNCTION tg_ttft_quantile(h bigint[], q double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT tg_ttft_bucket_ms((min(k) - 1)::int)
    FROM (SELECT k, sum(v) OVER (ORDER BY k) AS cum, sum(v) OVER () AS n
          FROM unnest(h) WITH ORDINALITY AS x(v, k)) c
    WHERE n > 0 AND cum >= q * n
$$;

-- The rollup hour of a usage row.
CREATE FUNCTION tg_usage_hour(started timestamptz, created timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT date_trunc('hour', CASE WHEN started > '-infinity' THEN started ELSE created END, 'UTC')
$$;

-- Per hour × account × group of the compacted days: what the capacity report needs by
-- hour (time in flight, requests, 429s, tokens) without reading every combination.
CREATE TABLE usage_capacity_hourly (
    hour        timestamptz NOT NULL,
    account_id  bigint NOT NULL,
    group_id    bigint NOT NULL,
    requests    bigint NOT NULL DEFAULT 0,
    successes   bigint NOT NULL DEFAULT 0,
    err_429     bigint NOT NULL DEFAULT 0,
    tokens      bigint NOT NULL DEFAULT 0,
    busy_ms     double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, account_id, group_id)
);

CREATE TABLE usage_days_compacted (
    day         date PRIMARY KEY,
    compacted_at timestamptz NOT NULL DEFAULT now()
);

-- The tables, the batch's upsert, the compaction and the rebuild share one list of
-- measures; they are generated from it.
DO $gen$
DECLARE
    measures text[] := ARRAY['requests', 'successes', 'err_429', 'err_5xx', 'err_timeout', 'err_client_gone',
                             'err_other', 'estimated', 'input_tokens', 'output_tokens', 'cache_read_tokens',
                             'cache_write_tokens', 'reasoning_tokens', 'cost', 'list_value', 'busy_ms', 'ttft_n',
                             'ttft_sum_ms'];
    types text[] := ARRAY['bigint', 'bigint', 'bigint', 'bigint', 'bigint', 'bigint', 'bigint', 'bigint', 'bigint',
                          'bigint', 'bigint', 'bigint', 'bigint', 'numeric(30, 10)', 'numeric(30, 10)',
                          'double precision', 'bigint', 'double precision'];
    -- over a normalized row n (hour, tenant_id, api_key_id, g, a, model, i, o, cr, cw, r, cost, est, k, b,
    -- ttft_ms, total_ms) joined with its price p
    aggs text[] := ARRAY['count(*)', 'count(*) FILTER (WHERE n.k = 0)', 'count(*) FILTER (WHERE n.k = 1)',
                         'count(*) FILTER (WHERE n.k = 2)', 'count(*) FILTER (WHERE n.k = 3)',
                         'count(*) FILTER (WHERE n.k = 4)', 'count(*) FILTER (WHERE n.k = 5)',
                         'count(*) FILTER (WHERE n.est)', 'coalesce(sum(n.i), 0)', 'coalesce(sum(n.o), 0)',
                         'coalesce(sum(n.cr), 0)', 'coalesce(sum(n.cw), 0)', 'coalesce(sum(n.r), 0)',
                         'coalesce(sum(n.cost), 0)',
                         'coalesce(sum((coalesce(n.i, 0) * p.input + (coalesce(n.o, 0) - least(coalesce(n.r, 0), '
                         'coalesce(n.o, 0))) * p.output + least(coalesce(n.r, 0), coalesce(n.o, 0)) * '
                         'coalesce(p.reasoning, p.output) + coalesce(n.cr, 0) * p.cache_read + coalesce(n.cw, 0) * '
                         'p.cache_write) / 1000000) FILTER (WHERE n.k = 0), 0)',
                         'coalesce(sum(n.total_ms), 0)', 'count(n.ttft_ms)', 'coalesce(sum(n.ttft_ms), 0)'];
    cols text := '';       -- "requests bigint NOT NULL DEFAULT 0, ..."
    names text := '';      -- "requests, successes, ..."
    sel text := '';        -- the aggregates
    sums text := '';       -- "sum(requests), ..."
    upd text := '';        -- "requests = x.requests + EXCLUDED.requests, ..."
    dims text := 'tenant_id bigint NOT NULL, api_key_id bigint NOT NULL, group_id bigint NOT NULL, '
                 'account_id bigint NOT NULL, model text NOT NULL';
    keycols text := 'tenant_id, api_key_id, group_id, account_id, model';
    agg_from text;
BEGIN
    FOR i IN 1 .. array_length(measures, 1) LOOP
        cols := cols || format('%I %s NOT NULL DEFAULT 0, ', measures[i], types[i]);
        names := names || format('%s%I', CASE WHEN i > 1 THEN ', ' END, measures[i]);
        sel := sel || format('%s%s', CASE WHEN i > 1 THEN ', ' END, aggs[i]);
        sums := sums || format('%ssum(%I)', CASE WHEN i > 1 THEN ', ' END, measures[i]);
        upd := upd || format('%s%I = x.%I + EXCLUDED.%I', CASE WHEN i > 1 THEN ', ' END, measures[i], measures[i],
                             measures[i]);
    END LOOP;
    FOR k IN 0 .. 47 LOOP
        cols := cols || format('h%s integer NOT NULL DEFAULT 0, ', k);
        names := names || format(', h%s', k);
        sel := sel || format(', count(*) FILTER (WHERE n.b = %s)', k);
        sums := sums || format(', sum(h%s)', k);
        upd := upd || format(', h%s = x.h%s + EXCLUDED.h%s', k, k, k);
    END LOOP;

    EXECUTE format('CREATE TABLE usage_hourly (hour timestamptz NOT NULL, %s, %s PRIMARY KEY (hour, %s))',
                   dims, cols, keycols);
    EXECUTE format('CREATE TABLE usage_daily (day date NOT NULL, %s, %s PRIMARY KEY (day, %s))', dims, cols, keycols);
    -- reports by account or group over a range
    CREATE INDEX usage_daily_account ON usage_daily (account_id, day);
    CREATE INDEX usage_hourly_account ON usage_hourly (account_id, hour);

    agg_from := ' FROM n LEFT JOIN model_prices p ON p.model = n.model GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6';

    -- The batch's rows, aggregated: one upsert for the hours, and only when a day the
    -- batch touches was compacted already (a late settlement), one for the days.
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS $body$
        BEGIN
            IF cardinality(won) = 0 THEN
                RETURN;
            END IF;
            WITH n AS (
                SELECT tg_usage_hour(tg_request_started(w.request_id), now()) AS hour, w.tenant_id, w.api_key_id,
                       coalesce(w.group_id, 0) AS g, coalesce(w.account_id, 0) AS a, w.model, w.input AS i,
                       w.output AS o, w.cache_read AS cr, w.cache_write AS cw, w.reasoning AS r, w.cost,
                       w.estimated AS est, tg_usage_class(w.status) AS k, tg_ttft_bucket(w.ttft_ms) AS b, w.ttft_ms,
                       w.total_ms
                FROM unnest(won) w)
            INSERT INTO usage_hourly AS x (hour, %1$s, %2$s)
            SELECT n.hour, n.tenant_id, n.api_key_id, n.g, n.a, n.model, %3$s %4$s
            ON CONFLICT (hour, %1$s) DO UPDATE SET %5$s;
            IF EXISTS (SELECT 1 FROM usage_days_compacted c
                       WHERE c.day IN (SELECT DISTINCT (tg_usage_hour(tg_request_started(w.request_id), now())
                                                        AT TIME ZONE 'UTC')::date FROM unnest(won) w)) THEN
                WITH n AS (
                    SELECT (tg_usage_hour(tg_request_started(w.request_id), now()) AT TIME ZONE 'UTC')::date AS hour,
                           w.tenant_id, w.api_key_id, coalesce(w.group_id, 0) AS g, coalesce(w.account_id, 0) AS a,
                           w.model, w.input AS i, w.output AS o, w.cache_read AS cr, w.cache_write AS cw,
                           w.reasoning AS r, w.cost, w.estimated AS est, tg_usage_class(w.status) AS k,
                           tg_ttft_bucket(w.ttft_ms) AS b, w.ttft_ms, w.total_ms
                    FROM unnest(won) w
                    WHERE (tg_usage_hour(tg_request_started(w.request_id), now()) AT TIME ZONE 'UTC')::date IN
                          (SELECT day FROM usage_days_compacted))
                INSERT INTO usage_daily AS x (day, %1$s, %2$s)
                SELECT n.hour, n.tenant_id, n.api_key_id, n.g, n.a, n.model, %3$s %4$s
                ON CONFLICT (day, %1$s) DO UPDATE SET %5$s;
                INSERT INTO usage_capacity_hourly AS x (hour, account_id, group_id, requests, successes, err_429, tokens,
                                                        busy_ms)
                SELECT tg_usage_hour(tg_request_started(w.request_id), now()), coalesce(w.account_id, 0),
                       coalesce(w.group_id, 0), count(*), count(*) FILTER (WHERE tg_usage_class(w.status) = 0),
                       count(*) FILTER (WHERE tg_usage_class(w.status) = 1),
                       coalesce(sum(coalesce(w.input, 0) + coalesce(w.output, 0) + coalesce(w.cache_read, 0) +
                                    coalesce(w.cache_write, 0)), 0), coalesce(sum(w.total_ms), 0)
                FROM unnest(won) w
                WHERE (tg_usage_hour(tg_request_started(w.request_id), now()) AT TIME ZONE 'UTC')::date IN
                      (SELECT day FROM usage_days_compacted)
                GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
                ON CONFLICT (hour, account_id, group_id) DO UPDATE SET requests = x.requests + EXCLUDED.requests,
                    successes = x.successes + EXCLUDED.successes, err_429 = x.err_429 + EXCLUDED.err_429,
                    tokens = x.tokens + EXCLUDED.tokens, busy_ms = x.busy_ms + EXCLUDED.busy_ms;
            END IF;
        END $body$
    $f$, keycols, names, sel, agg_from, upd);

    -- Day d's hourly rollups recomputed from its usage rows (its partition; rows without
    -- a start: by the day they were settled). Returns the usage rows read.
    EXECUTE format($f$
        CREATE FUNCTION tg_usage_rebuild_day(d date) RETURNS bigint LANGUAGE plpgsql AS $body$
        DECLARE
            lo timestamptz := d::timestamp AT TIME ZONE 'UTC';
            hi timestamptz := (d + 1)::timestamp AT TIME ZONE 'UTC';
            n bigint;
        BEGIN
            LOCK TABLE usage_hourly, usage_daily, usage_capacity_hourly IN SHARE ROW EXCLUSIVE MODE;
            DELETE FROM usage_hourly WHERE hour >= lo AND hour < hi;
            WITH n AS (
                SELECT tg_usage_hour(u.started_at, u.created_at) AS hour, u.tenant_id, u.api_key_id,
                       coalesce(u.group_id, 0) AS g, coalesce(u.account_id, 0) AS a, u.model, u.input_tokens AS i,
                       u.output_tokens AS o, u.cache_read_tokens AS cr, u.cache_write_tokens AS cw,
                       u.reasoning_tokens AS r, u.cost, u.estimated AS est, tg_usage_class(u.status) AS k,
                       tg_ttft_bucket(u.ttft_ms) AS b, u.ttft_ms, u.total_ms
                FROM usage u
                WHERE (u.started_at >= lo AND u.started_at < hi)
                   OR (u.started_at = '-infinity' AND u.created_at >= lo AND u.created_at < hi))
            INSERT INTO usage_hourly (hour, %1$s, %2$s)
            SELECT n.hour, n.tenant_id, n.api_key_id, n.g, n.a, n.model, %3$s %4$s;
            SELECT coalesce(sum(requests), 0) INTO n FROM usage_hourly WHERE hour >= lo AND hour < hi;
            IF EXISTS (SELECT 1 FROM usage_days_compacted WHERE day = d) THEN
                DELETE FROM usage_daily WHERE day = d;
                INSERT INTO usage_daily (day, %1$s, %2$s)
                SELECT d, %1$s, %6$s FROM usage_hourly WHERE hour >= lo AND hour < hi GROUP BY %1$s;
                DELETE FROM usage_capacity_hourly WHERE hour >= lo AND hour < hi;
                INSERT INTO usage_capacity_hourly (hour, account_id, group_id, requests, successes, err_429, tokens, busy_ms)
                SELECT hour, account_id, group_id, sum(requests), sum(successes), sum(err_429),
                       sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens), sum(busy_ms)
                FROM usage_hourly WHERE hour >= lo AND hour < hi GROUP BY 1, 2, 3;
            END IF;
            RETURN n;
        END $body$
    $f$, keycols, names, sel, agg_from, upd, sums);

    -- The days that are over and not compacted yet, folded into usage_daily, one
    -- transaction (one lock) for all of them. Returns how many.
    EXECUTE format($f$
        CREATE FUNCTION tg_usage_compact() RETURNS int LANGUAGE plpgsql AS $body$
        DECLARE
            today date := (now() AT TIME ZONE 'UTC')::date;
            done int := 0;
            d date;
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM usage_hourly WHERE hour < today::timestamp AT TIME ZONE 'UTC'
                           AND (hour AT TIME ZONE 'UTC')::date NOT IN (SELECT day FROM usage_days_compacted)) THEN
                RETURN 0;
            END IF;
            LOCK TABLE usage_hourly, usage_daily, usage_capacity_hourly IN SHARE ROW EXCLUSIVE MODE;
            FOR d IN SELECT DISTINCT (hour AT TIME ZONE 'UTC')::date FROM usage_hourly
                     WHERE hour < today::timestamp AT TIME ZONE 'UTC'
                       AND (hour AT TIME ZONE 'UTC')::date NOT IN (SELECT day FROM usage_days_compacted) LOOP
                DELETE FROM usage_daily WHERE day = d;
                INSERT INTO usage_daily (day, %1$s, %2$s)
                SELECT d, %1$s, %3$s FROM usage_hourly
                WHERE hour >= d::timestamp AT TIME ZONE 'UTC' AND hour < (d + 1)::timestamp AT TIME ZONE 'UTC'
                GROUP BY %1$s;
                DELETE FROM usage_capacity_hourly WHERE hour >= d::timestamp AT TIME ZONE 'UTC' AND hour < (d + 1)::timestamp AT TIME ZONE 'UTC';
                INSERT INTO usage_capacity_hourly (hour, account_id, group_id, requests, successes, err_429, tokens, busy_ms)
                SELECT hour, account_id, group_id, sum(requests), sum(successes), sum(err_429),
                       sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens), sum(busy_ms)
                FROM usage_hourly WHERE hour >= d::timestamp AT TIME ZONE 'UTC' AND hour < (d + 1)::timestamp AT TIME ZONE 'UTC' GROUP BY 1, 2, 3;
                INSERT INTO usage_days_compacted (day) VALUES (d);
                done := done + 1;
            END LOOP;
            RETURN done;
        END $body$
    $f$, keycols, names, sums);

    -- The report: the rollups of [p_from, p_to) (whole hours) grouped by p_group (hour,
    -- day, tenant, key, group, account, model; none: one total row), filtered, one page
    -- (p_limit rows from p_offset, ordered by the groups), as JSON ({data, has_more}) or
    -- as CSV lines (fmt 'csv', the header with the first page). Compacted days that lie
    -- whole in the range are read from usage_daily (unless grouped by hour), every other
    -- hour from usage_hourly, by its key (hour = ANY): a 14-day report reads ~14 daily
    -- rows per combination, not 336 hourly ones.
    EXECUTE format($f$
        CREATE FUNCTION tg_usage_report(p_from timestamptz, p_to timestamptz, p_group text[], p_tenant bigint,
                                        p_key bigint, p_group_id bigint, p_account bigint, p_model text,
                                        p_limit int, p_offset int, fmt text DEFAULT 'json')
        RETURNS text LANGUAGE plpgsql STABLE AS $body$
        DECLARE
            cdays date[] := '{}';
            uhours timestamptz[];
            keys text := '';      -- the group columns, for GROUP BY / ORDER BY
            skeys text := '';     -- the same, selected (the hour or day as t)
            jkeys text := '';     -- their JSON members
            ckeys text := '';     -- their CSV fields
            chead text := '';
            g text;
            filt text := ' AND ($3 IS NULL OR tenant_id = $3) AND ($4 IS NULL OR api_key_id = $4) AND ($5 IS NULL OR '
                         'group_id = $5) AND ($6 IS NULL OR account_id = $6) AND ($7 IS NULL OR model = $7)';
            q text;
            out text;
        BEGIN
            IF NOT 'hour' = ANY (p_group) THEN
                cdays := ARRAY(SELECT day FROM usage_days_compacted
                               WHERE day::timestamp AT TIME ZONE 'UTC' >= p_from
                                 AND (day + 1)::timestamp AT TIME ZONE 'UTC' <= p_to ORDER BY day);
            END IF;
            uhours := ARRAY(SELECT h FROM generate_series(p_from, p_to - interval '1 hour', interval '1 hour') h
                            WHERE NOT (h AT TIME ZONE 'UTC')::date = ANY (cdays));
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
                ckeys := ckeys || CASE g
                    WHEN 'hour' THEN 'to_char(t AT TIME ZONE ''UTC'', ''YYYY-MM-DD"T"HH24:MI:SS"Z"'')'
                    WHEN 'day' THEN 'to_char(t AT TIME ZONE ''UTC'', ''YYYY-MM-DD'')'
                    WHEN 'tenant' THEN 'tenant_id::text' WHEN 'key' THEN 'api_key_id::text'
                    WHEN 'group' THEN 'coalesce(nullif(group_id, 0)::text, '''')'
                    WHEN 'account' THEN 'coalesce(nullif(account_id, 0)::text, '''')'
                    ELSE '''"'' || replace(model, ''"'', ''""'') || ''"''' END || ' || '','' || ';
                chead := chead || CASE g WHEN 'tenant' THEN 'tenant_id' WHEN 'key' THEN 'api_key_id'
                                         WHEN 'group' THEN 'group_id' WHEN 'account' THEN 'account_id' ELSE g END || ',';
            END LOOP;
            q := 'WITH src AS (SELECT hour AS t, %1$s, %2$s FROM usage_hourly WHERE hour = ANY ($1)' || filt ||
                 ' UNION ALL SELECT day::timestamp AT TIME ZONE ''UTC'', %1$s, %2$s FROM usage_daily WHERE day = ANY ($2)' ||
                 filt || '), r AS (SELECT ' || skeys || 'sum(requests) AS requests, sum(successes) AS successes, '
                 'sum(err_429) AS e429, sum(err_5xx) AS e5xx, sum(err_timeout) AS etimeout, '
                 'sum(err_client_gone) AS egone, sum(err_other) AS eother, sum(estimated) AS estimated, '
                 'sum(input_tokens) AS ti, sum(output_tokens) AS tout, sum(cache_read_tokens) AS tcr, '
                 'sum(cache_write_tokens) AS tcw, sum(reasoning_tokens) AS tr, sum(cost) AS cost, '
                 'sum(list_value) AS list_value, sum(busy_ms) AS busy_ms, sum(ttft_n) AS ttft_n, '
                 'sum(ttft_sum_ms) AS ttft_sum, ARRAY[%3$s] AS hist FROM src ' ||
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
                    p_model, p_limit, p_offset;
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
                p_model, p_limit, p_offset;
            RETURN out;
        END $body$
    $f$, 'tenant_id, api_key_id, group_id, account_id, model', names,
         (SELECT string_agg(format('sum(h%s)', k), ', ' ORDER BY k) FROM generate_series(0, 47) k));

    -- The capacity report per account (p_by 'account') or per group ('group') over
    -- [p_from, p_to): equivalent value, success rate, P95 TTFT, 429 share, utilisation,
    -- the requests in flight per hour (mean over each hour: Σ time in flight ÷ 3600 s;
    -- P95 and max over every hour of the range, idle ones included), for subscription
    -- accounts the use of their reset windows (tokens per window of p_window_hours), and
    -- the recommendation with the rule that produced it (also in the answer):
    --   account: recommended_concurrency = max(1, ceil(1.25 × P95 in flight)); when 2% or
    --            more of its requests got 429, at most max(1, floor(0.8 × concurrency));
    --   group:   recommended_oversubscription = sold ÷ max(1, 1.25 × P95 in flight), where sold
    --            is Σ its keys' concurrency (null when a key has none: unbounded).
    EXECUTE format($f$
        CREATE FUNCTION tg_usage_capacity(p_from timestamptz, p_to timestamptz, p_by text, p_window_hours int DEFAULT 5)
        RETURNS text LANGUAGE plpgsql STABLE AS $body$
        DECLARE
            cdays date[];
            uhours timestamptz[];
            nhours int := round(extract(epoch FROM p_to - p_from) / 3600);
            out text;
        BEGIN
            cdays := ARRAY(SELECT day FROM usage_days_compacted WHERE day::timestamp AT TIME ZONE 'UTC' >= p_from
                           AND (day + 1)::timestamp AT TIME ZONE 'UTC' <= p_to ORDER BY day);
            uhours := ARRAY(SELECT h FROM generate_series(p_from, p_to - interval '1 hour', interval '1 hour') h
                            WHERE NOT (h AT TIME ZONE 'UTC')::date = ANY (cdays));
            WITH cap AS (
                SELECT hour, account_id, group_id, busy_ms, tokens FROM usage_capacity_hourly
                WHERE hour >= p_from AND hour < p_to AND (hour AT TIME ZONE 'UTC')::date = ANY (cdays)
                UNION ALL
                SELECT hour, account_id, group_id, sum(busy_ms),
                       sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens)
                FROM usage_hourly WHERE hour = ANY (uhours) GROUP BY 1, 2, 3),
            src AS (
                SELECT account_id, group_id, requests, successes, err_429, list_value, cost, busy_ms, %1$s
                FROM usage_hourly WHERE hour = ANY (uhours)
                UNION ALL
                SELECT account_id, group_id, requests, successes, err_429, list_value, cost, busy_ms, %1$s
                FROM usage_daily WHERE day = ANY (cdays)),
            tot AS (
                SELECT CASE WHEN p_by = 'group' THEN group_id ELSE account_id END AS id, sum(requests) AS req,
                       sum(successes) AS ok, sum(err_429) AS e429, sum(list_value) AS val, sum(cost) AS cost,
                       sum(busy_ms) AS busy, ARRAY[%2$s] AS hist
                FROM src GROUP BY 1),
            ph AS (
                SELECT CASE WHEN p_by = 'group' THEN group_id ELSE account_id END AS id, hour,
                       sum(busy_ms) / 3600000.0 AS inflight, sum(tokens) AS tokens
                FROM cap GROUP BY 1, 2),
            pk AS (
                SELECT t.id, percentile_cont(0.95) WITHIN GROUP (ORDER BY coalesce(ph.inflight, 0)) AS p95,
                       max(coalesce(ph.inflight, 0)) AS mx
                FROM tot t CROSS JOIN generate_series(p_from, p_to - interval '1 hour', interval '1 hour') h
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
                FROM tot t JOIN pk ON pk.id = t.id LEFT JOIN win ON win.id = t.id
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
    $f$, (SELECT string_agg(format('h%s', k), ', ' ORDER BY k) FROM generate_series(0, 47) k),
         (SELECT string_agg(format('sum(h%s)', k), ', ' ORDER BY k) FROM generate_series(0, 47) k));
END $gen$;

-- The days `tollgate usage rebuild` may recompute within [from, to) (NULL: unbounded):
-- every day from the oldest usage row kept to today, but a day whose rows were in a
-- dropped partition (its rollups are all that is left of it).
CREATE FUNCTION tg_usage_days(dfrom date, dto date) RETURNS SETOF date LANGUAGE sql STABLE AS $$
    SELECT g.d
    FROM (SELECT t::date AS d FROM generate_series(
             coalesce(dfrom, least((SELECT min((created_at AT TIME ZONE 'UTC')::date) FROM usage
                                    WHERE started_at = '-infinity'),
                                   (SELECT min((lo AT TIME ZONE 'UTC')::date) FROM detail_partitions
                                    WHERE parent = 'usage' AND NOT legacy AND dropped_at IS NULL
                                    AND EXISTS (SELECT 1 FROM usage WHERE started_at >= lo AND started_at < hi)),
                                   (SELECT min((started_at AT TIME ZONE 'UTC')::date) FROM usage_default),
                                   (now() AT TIME ZONE 'UTC')::date)),
             coalesce(dto, (now() AT TIME ZONE 'UTC')::date + 1) - 1, interval '1 day') AS t) g
    WHERE NOT EXISTS (SELECT 1 FROM detail_partitions p WHERE p.parent = 'usage' AND p.dropped_at IS NOT NULL
                      AND ((NOT p.legacy AND p.lo < (g.d + 1)::timestamp AT TIME ZONE 'UTC'
                            AND p.hi > g.d::timestamp AT TIME ZONE 'UTC')
                           OR (p.legacy AND g.d::timestamp AT TIME ZONE 'UTC' <= p.rows_until)))
$$;

-- The rollups of what was settled before this migration, day by day.
DO $$
DECLARE
    d date;
BEGIN
    FOR d IN SELECT DISTINCT (tg_usage_hour(started_at, created_at) AT TIME ZONE 'UTC')::date FROM usage LOOP
        PERFORM tg_usage_rebuild_day(d);
    END LOOP;
END $$;
