-- Usage cubes (issue #18, item 6): every summary and capacity query over 14 days under
-- 200 ms at p95.
--
-- A report's cost is the number of rollup rows it sums (66 measures each) and the groups
-- it prints. 0014's coarse rollups (hour × group × account × model, 240 rows an hour in
-- spec/bench/usage_bench.sh) left the reports that need the tenant or the key on the fine
-- rows (3,200 an hour), `group_by=hour` summing 80,000 coarse rows, and the capacity
-- report summing the model dimension away on every call. Four more cubes, each the same
-- measures per hour (usage_hourly_<cube>) and per compacted day (usage_daily_<cube>) over
-- fewer dimensions:
--
--   cube           dimensions                          rows an hour in the bench
--   model          group, model                           30
--   account_group  group, account                         40
--   tenant         tenant, group, model                  120
--   acct           group, account, model (0014)          240
--   key            tenant, key, group, model             400
--   (fine          tenant, key, group, account, model  3,200: usage_hourly, usage_daily)
--
-- A report reads the first cube in that order whose dimensions hold its grouping and its
-- filters (by model, day, hour or group: model; by account: account_group; by tenant:
-- tenant; by account and model: acct; by key: key; by tenant or key and account: the fine
-- rows). The capacity report reads account_group, its time in flight per hour too.
--
-- Kept exactly like 0014's: off the settlement path, by tg_usage_acct_refresh (now every
-- cube): the compaction folds the hours that are over (below the watermark
-- usage_acct_until) and the compacted days into them, a rebuild of a day recomputes its
-- rows, and a late batch (an hour below the watermark) recomputes the rows of the
-- combinations it touched, in the same transaction (tg_usage_rollup). A settlement of the
-- current hour still costs one comparison. The key and acct cubes are summed from the
-- fine rows, tenant from key, model and account_group from acct.
--
-- The TTFT quantiles (0010's SQL function: unnest and two window sums, ~0.2 ms a call,
-- two calls per group: 150 ms for 336 hourly groups) become a PL/pgSQL loop, both from one
-- call in the report (tg_ttft_quantiles). The same answers.

DO $gen$
DECLARE
    -- the measures (requests .. ttft_sum_ms, h0 .. h47), as in usage_hourly_acct
    names text := (SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
                   WHERE attrelid = 'usage_hourly_acct'::regclass AND attnum > 0 AND NOT attisdropped
                     AND attname NOT IN ('hour', 'group_id', 'account_id', 'model'));
    cols text := (SELECT string_agg(format('%I %s NOT NULL DEFAULT 0', attname, format_type(atttypid, atttypmod)), ', '
                                    ORDER BY attnum) FROM pg_attribute
                  WHERE attrelid = 'usage_hourly_acct'::regclass AND attnum > 0 AND NOT attisdropped
                    AND attname NOT IN ('hour', 'group_id', 'account_id', 'model'));
    sums text;
    repl text;
    -- the cubes, in the order they are refreshed (a derived one after its source)
    cube text[] := ARRAY['acct', 'key', 'tenant', 'model', 'account_group'];
    dims text[] := ARRAY['group_id, account_id, model', 'tenant_id, api_key_id, group_id, model',
                         'tenant_id, group_id, model', 'group_id, model', 'group_id, account_id'];
    srch text[] := ARRAY['usage_hourly', 'usage_hourly', 'usage_hourly_key', 'usage_hourly_acct', 'usage_hourly_acct'];
    srcd text[] := ARRAY['usage_daily', 'usage_daily', 'usage_daily_key', 'usage_daily_acct', 'usage_daily_acct'];
    full_sql text := '';
    only_sql text := '';
    d text;
    defs text;
    jsel text;   -- a late batch's combinations, from p_only's members
BEGIN
    SELECT string_agg(format('sum(%s)', x), ', '), string_agg(format('%s = EXCLUDED.%s', x, x), ', ')
    INTO sums, repl FROM unnest(string_to_array(names, ', ')) x;

    FOR i IN 1 .. array_length(cube, 1) LOOP
        defs := '';
        jsel := '';
        FOREACH d IN ARRAY string_to_array(dims[i], ', ') LOOP
            defs := defs || format('%I %s NOT NULL, ', d, CASE WHEN d = 'model' THEN 'text' ELSE 'bigint' END);
            jsel := jsel || format(', (e->>%L)%s AS %I', CASE d WHEN 'tenant_id' THEN 't' WHEN 'api_key_id' THEN 'k'
                                                               WHEN 'group_id' THEN 'g' WHEN 'account_id' THEN 'a'
                                                               ELSE 'm' END,
                                   CASE WHEN d = 'model' THEN '' ELSE '::bigint' END, d);
        END LOOP;
        IF cube[i] <> 'acct' THEN
            EXECUTE format('CREATE TABLE %I (hour timestamptz NOT NULL, %s%s, PRIMARY KEY (hour, %s))',
                           'usage_hourly_' || cube[i], defs, cols, dims[i]);
            EXECUTE format('CREATE TABLE %I (day date NOT NULL, %s%s, PRIMARY KEY (day, %s))',
                           'usage_daily_' || cube[i], defs, cols, dims[i]);
        END IF;
        full_sql := full_sql || format($s$
                DELETE FROM %1$I WHERE hour >= lo AND hour < hi;
                INSERT INTO %1$I (hour, %3$s, %5$s) SELECT hour, %3$s, %6$s FROM %4$I
                WHERE hour >= lo AND hour < hi GROUP BY hour, %3$s;
                DELETE FROM %2$I WHERE day >= dlo AND day < dhi;
                INSERT INTO %2$I (day, %3$s, %5$s) SELECT day, %3$s, %6$s FROM %7$I
                WHERE day >= dlo AND day < dhi AND day IN (SELECT day FROM usage_days_compacted) GROUP BY day, %3$s;$s$,
            'usage_hourly_' || cube[i], 'usage_daily_' || cube[i], dims[i], srch[i], names, sums, srcd[i]);
        only_sql := only_sql || format($s$
            INSERT INTO %1$I AS x (hour, %3$s, %5$s)
            SELECT hour, %3$s, %6$s FROM %4$I
            JOIN (SELECT DISTINCT (e->>'h')::timestamptz AS hour%9$s FROM jsonb_array_elements(p_only) e) k USING (hour, %3$s)
            WHERE hour >= lo AND hour < hi GROUP BY hour, %3$s ORDER BY hour, %3$s
            ON CONFLICT (hour, %3$s) DO UPDATE SET %8$s;
            INSERT INTO %2$I AS x (day, %3$s, %5$s)
            SELECT day, %3$s, %6$s FROM %7$I
            JOIN (SELECT DISTINCT (((e->>'h')::timestamptz) AT TIME ZONE 'UTC')::date AS day%9$s
                  FROM jsonb_array_elements(p_only) e) k USING (day, %3$s)
            WHERE day >= dlo AND day < dhi AND day IN (SELECT day FROM usage_days_compacted)
            GROUP BY day, %3$s ORDER BY day, %3$s
            ON CONFLICT (day, %3$s) DO UPDATE SET %8$s;$s$,
            'usage_hourly_' || cube[i], 'usage_daily_' || cube[i], dims[i], srch[i], names, sums, srcd[i], repl, jsel);
    END LOOP;

    -- The rows of every cube for hours [lo, hi) and for the compacted days among
    -- [dlo, dhi) recomputed (only the combinations in `p_only` when given: a late
    -- batch's, [{"h": hour, "t": tenant, "k": key, "g": group, "a": account, "m": model}]).
    -- The caller holds the rollups' lock (or, for p_only, the rows it just settled).
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION tg_usage_acct_refresh(lo timestamptz, hi timestamptz, dlo date, dhi date,
                                                         p_only jsonb DEFAULT NULL) RETURNS void LANGUAGE plpgsql AS $body$
        BEGIN
            IF p_only IS NULL THEN %1$s
                RETURN;
            END IF; %2$s
        END $body$
    $f$, full_sql, only_sql);
END $gen$;

-- A late batch's combinations, now with tenant and key (for the key and tenant cubes).
CREATE OR REPLACE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    upto timestamptz;
    late jsonb;
BEGIN
    PERFORM tg_usage_rollup_fine(won);
    IF cardinality(won) = 0 THEN
        RETURN;
    END IF;
    upto := (SELECT u.upto FROM usage_acct_until u);
    SELECT jsonb_agg(DISTINCT jsonb_build_object('h', h, 't', w.tenant_id, 'k', w.api_key_id,
                                                 'g', coalesce(w.group_id, 0), 'a', coalesce(w.account_id, 0),
                                                 'm', w.model))
    INTO late
    FROM unnest(won) w, LATERAL (SELECT tg_usage_hour(tg_request_started(w.request_id), now()) AS h) x
    WHERE x.h < upto;
    IF late IS NOT NULL THEN
        PERFORM tg_usage_acct_refresh('-infinity', upto, '-infinity', 'infinity', late);
    END IF;
END $$;

-- A TTFT quantile of a summed histogram (0010), as a loop.
CREATE OR REPLACE FUNCTION tg_ttft_quantile(h bigint[], q double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    n bigint := 0;
    cum bigint := 0;
BEGIN
    FOR k IN 1 .. coalesce(array_length(h, 1), 0) LOOP
        n := n + coalesce(h[k], 0);
    END LOOP;
    IF n <= 0 THEN
        RETURN NULL;
    END IF;
    FOR k IN 1 .. array_length(h, 1) LOOP
        cum := cum + coalesce(h[k], 0);
        IF cum::double precision >= q * n::double precision THEN
            RETURN tg_ttft_bucket_ms(k - 1);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;


-- P50 and P95 of a summed histogram, as tg_ttft_quantile(h, 0.5) and (h, 0.95), in one
-- call: what a report shows for each group.
CREATE FUNCTION tg_ttft_quantiles(h bigint[]) RETURNS double precision[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    n bigint := 0;
    cum bigint := 0;
    k int := 0;
    v bigint;
    p50 double precision;
BEGIN
    IF h IS NULL THEN
        RETURN ARRAY[NULL, NULL]::double precision[];
    END IF;
    FOREACH v IN ARRAY h LOOP
        n := n + coalesce(v, 0);
    END LOOP;
    IF n <= 0 THEN
        RETURN ARRAY[NULL, NULL]::double precision[];
    END IF;
    FOREACH v IN ARRAY h LOOP
        cum := cum + coalesce(v, 0);
        IF p50 IS NULL AND cum::double precision >= 0.5::double precision * n::double precision THEN
            p50 := tg_ttft_bucket_ms(k);
        END IF;
        IF cum::double precision >= 0.95::double precision * n::double precision THEN
            RETURN ARRAY[p50, tg_ttft_bucket_ms(k)];
        END IF;
        k := k + 1;
    END LOOP;
    RETURN ARRAY[p50, NULL];
END $$;

-- The report (as in 0014), reading the smallest cube that has what it groups and filters by.
DO $gen$
DECLARE
    names text := (SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
                   WHERE attrelid = 'usage_hourly'::regclass AND attnum > 0 AND NOT attisdropped
                     AND attname NOT IN ('hour', 'tenant_id', 'api_key_id', 'group_id', 'account_id', 'model'));
    hist text := (SELECT string_agg(format('sum(h%s)', k), ', ' ORDER BY k) FROM generate_series(0, 47) k);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION tg_usage_report(p_from timestamptz, p_to timestamptz, p_group text[], p_tenant bigint,
                                        p_key bigint, p_group_id bigint, p_account bigint, p_model text,
                                        p_limit int, p_offset int, fmt text DEFAULT 'json')
        RETURNS text LANGUAGE plpgsql STABLE SET jit = off SET max_parallel_workers_per_gather = 0 AS $body$
        DECLARE
            cdays date[] := '{}';
            uhours timestamptz[];   -- hours read from usage_hourly
            ahours timestamptz[] := '{}';   -- hours read from the cube's hourly rows
            -- the dimensions the grouping and the filters need, and the smallest cube that has them
            need text[] := ARRAY(SELECT CASE x WHEN 'tenant' THEN 'tenant_id' WHEN 'key' THEN 'api_key_id'
                                                WHEN 'group' THEN 'group_id' WHEN 'account' THEN 'account_id' ELSE x END
                                 FROM unnest(p_group) x WHERE x IN ('tenant', 'key', 'group', 'account', 'model'))
                           || CASE WHEN p_tenant IS NOT NULL THEN '{tenant_id}'::text[] ELSE '{}' END
                           || CASE WHEN p_key IS NOT NULL THEN '{api_key_id}'::text[] ELSE '{}' END
                           || CASE WHEN p_group_id IS NOT NULL THEN '{group_id}'::text[] ELSE '{}' END
                           || CASE WHEN p_account IS NOT NULL THEN '{account_id}'::text[] ELSE '{}' END
                           || CASE WHEN p_model IS NOT NULL THEN '{model}'::text[] ELSE '{}' END;
            cube text := CASE WHEN need <@ '{group_id,model}' THEN 'model'
                              WHEN need <@ '{group_id,account_id}' THEN 'account_group'
                              WHEN need <@ '{tenant_id,group_id,model}' THEN 'tenant'
                              WHEN need <@ '{group_id,account_id,model}' THEN 'acct'
                              WHEN need <@ '{tenant_id,api_key_id,group_id,model}' THEN 'key' END;
            coarse boolean := cube IS NOT NULL;
            upto timestamptz := CASE WHEN coarse THEN (SELECT u.upto FROM usage_acct_until u) ELSE '-infinity' END;
            csel text := '';      -- the cube's columns as the fine ones (NULL for those it has not)
            d text;
            keys text := '';      -- the group columns, for GROUP BY / ORDER BY
            skeys text := '';     -- the same, selected (the hour or day as t)
            jkeys text := '';     -- their JSON members
            ckeys text := '';     -- their CSV fields
            chead text := '';
            g text;
            filt text := ' AND ($3 IS NULL OR tenant_id = $3) AND ($4 IS NULL OR api_key_id = $4) AND ($5 IS NULL OR '
                         'group_id = $5) AND ($6 IS NULL OR account_id = $6) AND ($7 IS NULL OR model = $7)';
            afilt text := '';   -- the filters on the cube's columns
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
                FOREACH d IN ARRAY ARRAY['tenant_id', 'api_key_id', 'group_id', 'account_id', 'model'] LOOP
                    IF d = ANY (CASE cube WHEN 'model' THEN '{group_id,model}'::text[]
                                          WHEN 'account_group' THEN '{group_id,account_id}'
                                          WHEN 'tenant' THEN '{tenant_id,group_id,model}'
                                          WHEN 'acct' THEN '{group_id,account_id,model}'
                                          ELSE '{tenant_id,api_key_id,group_id,model}' END) THEN
                        csel := csel || d || ', ';
                        afilt := afilt || format(' AND ($%%1$s IS NULL OR %%2$s = $%%1$s)',
                                                 array_position(ARRAY['tenant_id', 'api_key_id', 'group_id', 'account_id',
                                                                      'model'], d) + 2, d);
                    ELSE
                        csel := csel || CASE WHEN d = 'model' THEN 'NULL::text' ELSE 'NULL::bigint' END || ' AS ' || d || ', ';
                    END IF;
                END LOOP;
                src := 'SELECT hour AS t, ' || csel || '%%2$s FROM usage_hourly_' || cube || ' WHERE hour = ANY ($10)' || afilt ||
                       ' UNION ALL SELECT hour, %%1$s, %%2$s FROM usage_hourly WHERE hour = ANY ($1)' || filt ||
                       ' UNION ALL SELECT day::timestamp AT TIME ZONE ''UTC'', ' || csel || '%%2$s FROM usage_daily_' || cube ||
                       ' WHERE day = ANY ($2)' || afilt;
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
                     'round(busy_ms::numeric, 3) || '','' || ttft_n || '','' || coalesce(round(qq[1]::numeric, 1)::text, '''') '
                     '|| '','' || coalesce(round(qq[2]::numeric, 1)::text, '''') || chr(10), '''' '
                     'ORDER BY rn), '''') FROM (SELECT *, row_number() OVER () AS rn, tg_ttft_quantiles(hist) AS qq FROM r) x WHERE rn <= $8';
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
                 '''p50_ms'', round(qq[1]::numeric, 1), ''p95_ms'', '
                 'round(qq[2]::numeric, 1))) ORDER BY rn) FILTER (WHERE rn <= $8), ''[]''), '
                 '''has_more'', count(*) > $8)::text FROM (SELECT *, row_number() OVER () AS rn, tg_ttft_quantiles(hist) AS qq FROM r) x';
            EXECUTE format(q, %1$L, %2$L, %3$L) INTO out USING uhours, cdays, p_tenant, p_key, p_group_id, p_account,
                p_model, p_limit, p_offset, ahours;
            RETURN out;
        END $body$
    $f$, 'tenant_id, api_key_id, group_id, account_id, model', names, hist);
END $gen$;

-- The capacity report (as in 0014), from the account cube: its totals from the cube's
-- daily rows of the compacted days wholly in the range, its hourly rows of the other
-- hours below the watermark and the fine hourly rows of the rest; the time in flight per
-- hour from the cube's hourly rows (and the fine ones above the watermark). Every account
-- (or group) is listed, idle ones with zeros.
DO $gen$
DECLARE
    hist text := (SELECT string_agg(format('sum(h%s)', k), ', ' ORDER BY k) FROM generate_series(0, 47) k);
    hcols text := (SELECT string_agg(format('h%s', k), ', ' ORDER BY k) FROM generate_series(0, 47) k);
BEGIN
    EXECUTE format($f$
        CREATE OR REPLACE FUNCTION tg_usage_capacity(p_from timestamptz, p_to timestamptz, p_by text, p_window_hours int DEFAULT 5)
        RETURNS text LANGUAGE plpgsql STABLE SET jit = off SET max_parallel_workers_per_gather = 0 AS $body$
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
                SELECT hour, account_id, group_id, busy_ms,
                       input_tokens + output_tokens + cache_read_tokens + cache_write_tokens AS tokens
                FROM usage_hourly_account_group WHERE hour >= p_from AND hour < least(p_to, upto)
                UNION ALL
                SELECT hour, account_id, group_id, sum(busy_ms),
                       sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens)
                FROM usage_hourly WHERE hour = ANY (uhours) GROUP BY 1, 2, 3),
            src AS (
                SELECT account_id, group_id, requests, successes, err_429, list_value, cost, busy_ms, %1$s
                FROM usage_hourly WHERE hour = ANY (uhours)
                UNION ALL
                SELECT account_id, group_id, requests, successes, err_429, list_value, cost, busy_ms, %1$s
                FROM usage_hourly_account_group WHERE hour = ANY (ahours)
                UNION ALL
                SELECT account_id, group_id, requests, successes, err_429, list_value, cost, busy_ms, %1$s
                FROM usage_daily_account_group WHERE day = ANY (cdays)),
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

-- What this database holds already: every cube's rows below the watermark and of the
-- compacted days.
LOCK TABLE usage_hourly, usage_daily, usage_capacity_hourly, usage_hourly_acct, usage_daily_acct IN SHARE ROW EXCLUSIVE MODE;
SELECT tg_usage_acct_refresh('-infinity', (SELECT upto FROM usage_acct_until), '-infinity', 'infinity');
