-- Usage and ledger rows partitioned by time (issue #18, item 1), converted in place.
--
-- usage: by day of the request's start, `started_at`, which is part of the request id
-- itself: ids are `<start, Unix ms, 12 hex digits>-<18 random hex digits>` (the gateway,
-- tg_request_id), and tg_request_started(request_id) reads it back (an id without it —
-- written before this migration, or by hand — has no start: '-infinity'). A CHECK keeps
-- every row's started_at = tg_request_started(request_id), so (request_id, started_at),
-- the primary key a partitioned table needs, is unique exactly when request_id is: the
-- usage row stays its request's dedup, whatever partition it is in, and every settlement
-- of a request — the gateway's, a spool replayed days later, the reconciler's — computes
-- the same partition from the same id. Daily, not monthly: at 1,000 requests/s a day is
-- 86M rows (a month, 2.6G: too coarse to drop, too big an index to keep warm); with a
-- retention of 7–400 days that is 7–400 partitions, which pruning keeps cheap (every
-- lookup by request id also names its started_at).
--
-- ledger: by month of created_at. It is ~200× smaller (one `usage` entry per tenant per
-- settlement batch, since 0006) and kept for years: a month per partition keeps that to
-- tens of partitions. The key is (id, created_at); ids still come from ledger_id_seq.
--
-- In place: the existing tables become each parent's first partition (`usage_legacy`:
-- the rows without a start in their id, started_at '-infinity'; `ledger_legacy`: up to
-- the end of this month) — no row is copied; the migration builds one index on each
-- (the new keys) and checks the range constraints (one scan each). A DEFAULT partition
-- takes rows no partition covers yet (tg_partitions_ensure creates days and months ahead
-- and moves such rows into the partition it creates).
--
-- Retention (billing.usage_retention_days, billing.ledger_retention_days): only whole
-- partitions are dropped (tg_partition_drop, `tollgate usage drop`), and money is never
-- lost with them: before a partition goes, its totals are carried forward —
-- usage_carried (per tenant, key and ledger entry still in the ledger) and
-- ledger_carried (per tenant and kind) — and `tollgate ledger verify` adds those to what
-- remains. A settlement whose request falls in a dropped range is refused ('expired'):
-- its dedup row is gone, so it could otherwise bill twice.

-- The start of a request, from its id (see above).
CREATE FUNCTION tg_request_started(rid text) RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN rid ~ '^[0-9a-f]{12}-[0-9a-f]{18}$'
                THEN to_timestamp(('x' || lpad(left(rid, 12), 16, '0'))::bit(64)::bigint / 1000.0)
                ELSE '-infinity'::timestamptz END
$$;

-- Which partitions exist (and existed): the ranges tg_partitions_ensure made, the rows
-- they held when dropped.
CREATE TABLE detail_partitions (
    name        text PRIMARY KEY,
    parent      text NOT NULL CHECK (parent IN ('usage', 'ledger')),
    lo          timestamptz NOT NULL,
    hi          timestamptz NOT NULL,
    legacy      boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    dropped_at  timestamptz,
    dropped_rows bigint,
    rows_until  timestamptz      -- dropped: its newest row's created_at (rollups of later days are rebuildable)
);
CREATE INDEX detail_partitions_parent ON detail_partitions (parent, lo);

-- What dropped partitions held, carried forward (exact: NUMERIC sums).
CREATE TABLE usage_carried (
    partition   text NOT NULL,
    tenant_id   bigint NOT NULL,
    api_key_id  bigint NOT NULL,
    ledger_id   bigint,          -- the batch's ledger entry, while that entry is in the ledger
    requests    bigint NOT NULL,
    cost        numeric(24, 10) NOT NULL
);
CREATE INDEX usage_carried_tenant ON usage_carried (tenant_id);
CREATE INDEX usage_carried_ledger ON usage_carried (ledger_id) WHERE ledger_id IS NOT NULL;
CREATE TABLE ledger_carried (
    partition   text NOT NULL,
    tenant_id   bigint NOT NULL,
    kind        text NOT NULL,
    entries     bigint NOT NULL,
    amount      numeric(24, 10) NOT NULL,
    PRIMARY KEY (partition, tenant_id, kind)
);

-- ---- usage -----------------------------------------------------------------------------
DROP VIEW billing_dedup;
ALTER TABLE usage RENAME TO usage_legacy;
ALTER INDEX usage_tenant_time RENAME TO usage_legacy_tenant_time;
ALTER INDEX usage_key_time RENAME TO usage_legacy_key_time;
ALTER TABLE usage_legacy DROP CONSTRAINT usage_pkey;         -- the parent's key replaces it
ALTER TABLE usage_legacy RENAME CONSTRAINT usage_request_id_key TO usage_legacy_request_id_key;
DROP TRIGGER usage_immutable ON usage_legacy;     -- the parent's, cloned at attach, replaces it
ALTER TABLE usage_legacy ADD COLUMN started_at timestamptz NOT NULL DEFAULT '-infinity';
ALTER TABLE usage_legacy ADD CONSTRAINT usage_started_check CHECK (started_at = tg_request_started(request_id));

CREATE TABLE usage (
    id          bigint NOT NULL DEFAULT nextval('usage_id_seq'),
    request_id  text NOT NULL,
    tenant_id   bigint NOT NULL REFERENCES tenants (id),
    api_key_id  bigint NOT NULL REFERENCES api_keys (id),
    group_id    bigint,
    account_id  bigint,
    model       text NOT NULL,
    attempts    integer NOT NULL DEFAULT 1,
    input_tokens        bigint,
    output_tokens       bigint,
    cache_read_tokens   bigint,
    cache_write_tokens  bigint,
    reasoning_tokens    bigint,
    cost        numeric(24, 10) NOT NULL DEFAULT 0,
    estimated   boolean NOT NULL DEFAULT false,
    status      integer,
    ttft_ms     double precision,
    total_ms    double precision,
    created_at  timestamptz NOT NULL DEFAULT now(),
    attempt_ids jsonb NOT NULL DEFAULT '[]',
    fingerprint text,
    ledger_id   bigint,
    started_at  timestamptz NOT NULL DEFAULT '-infinity',
    CONSTRAINT usage_started_check CHECK (started_at = tg_request_started(request_id)),
    PRIMARY KEY (request_id, started_at)
) PARTITION BY RANGE (started_at);
ALTER SEQUENCE usage_id_seq OWNED BY usage.id;   -- not by a partition that may be dropped
CREATE INDEX usage_tenant_time ON usage (tenant_id, created_at);
CREATE INDEX usage_key_time ON usage (api_key_id, created_at);
CREATE INDEX usage_id ON usage (id);
CREATE TRIGGER usage_immutable BEFORE UPDATE OR DELETE ON usage
    FOR EACH ROW EXECUTE FUNCTION tg_usage_immutable();

ALTER TABLE usage_legacy ADD CONSTRAINT usage_legacy_pkey PRIMARY KEY (request_id, started_at);
ALTER TABLE usage_legacy DROP CONSTRAINT usage_legacy_request_id_key;
ALTER TABLE usage ATTACH PARTITION usage_legacy FOR VALUES FROM (MINVALUE) TO ('1970-01-01 00:00:00+00');
CREATE TABLE usage_default PARTITION OF usage DEFAULT;
INSERT INTO detail_partitions (name, parent, lo, hi, legacy)
VALUES ('usage_legacy', 'usage', '-infinity', '1970-01-01 00:00:00+00', true);

CREATE VIEW billing_dedup AS SELECT request_id, api_key_id, fingerprint, created_at FROM usage;

-- ---- ledger ----------------------------------------------------------------------------
ALTER TABLE ledger RENAME TO ledger_legacy;
ALTER INDEX ledger_tenant RENAME TO ledger_legacy_tenant;
ALTER TABLE ledger_legacy DROP CONSTRAINT ledger_pkey;
CREATE TABLE ledger (
    id          bigint NOT NULL DEFAULT nextval('ledger_id_seq'),
    tenant_id   bigint NOT NULL REFERENCES tenants (id),
    kind        text NOT NULL CONSTRAINT ledger_kind_check CHECK (kind IN ('opening', 'topup', 'usage', 'adjustment')),
    amount      numeric(24, 10) NOT NULL,
    request_id  text,
    note        text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
ALTER SEQUENCE ledger_id_seq OWNED BY ledger.id;
CREATE INDEX ledger_tenant ON ledger (tenant_id, created_at);
ALTER TABLE ledger_legacy ADD CONSTRAINT ledger_legacy_pkey PRIMARY KEY (id, created_at);
DO $$
DECLARE
    hi timestamptz := (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC';
BEGIN
    EXECUTE format('ALTER TABLE ledger ATTACH PARTITION ledger_legacy FOR VALUES FROM (MINVALUE) TO (%L)', hi);
    INSERT INTO detail_partitions (name, parent, lo, hi, legacy) VALUES ('ledger_legacy', 'ledger', '-infinity', hi, true);
END $$;
CREATE TABLE ledger_default PARTITION OF ledger DEFAULT;

-- ---- partitions: made ahead, dropped by retention ---------------------------------------

-- Creates parent's partition [lo, hi) named `name` unless one covers lo already. Rows of
-- that range that went to the DEFAULT partition meanwhile move into it, in this
-- transaction (usage rows keep their key, so the dedup holds across the move).
CREATE FUNCTION tg_partition_create(tbl text, pname text, plo timestamptz, phi timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    keycol text := CASE tbl WHEN 'usage' THEN 'started_at' ELSE 'created_at' END;
    moved bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM detail_partitions p WHERE p.parent = tbl AND p.lo < phi AND p.hi > plo
               AND p.dropped_at IS NULL) THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TEMP TABLE tg_moving ON COMMIT DROP AS SELECT * FROM %I WHERE %I >= %L AND %I < %L',
                   tbl || '_default', keycol, plo, keycol, phi);
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved > 0 THEN
        IF tbl = 'usage' THEN
            ALTER TABLE usage_default DISABLE TRIGGER usage_immutable;
        END IF;
        EXECUTE format('DELETE FROM %I WHERE %I >= %L AND %I < %L', tbl || '_default', keycol, plo, keycol, phi);
        IF tbl = 'usage' THEN
            ALTER TABLE usage_default ENABLE TRIGGER usage_immutable;
        END IF;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', pname, tbl, plo, phi);
    IF moved > 0 THEN
        EXECUTE format('INSERT INTO %I SELECT * FROM tg_moving', tbl);
    END IF;
    DROP TABLE tg_moving;
    INSERT INTO detail_partitions (name, parent, lo, hi) VALUES (pname, tbl, plo, phi)
    ON CONFLICT (name) DO UPDATE SET lo = EXCLUDED.lo, hi = EXCLUDED.hi, dropped_at = NULL, dropped_rows = NULL;
    RETURN true;
END $$;

-- The days of usage (UTC) from yesterday to `days_ahead` ahead, the months of the
-- ledger to next month: each partition that is missing is created. Returns how many.
-- The reconciler runs it every hour; `tollgate usage partitions` and `drop` too.
CREATE FUNCTION tg_partitions_ensure(days_ahead int DEFAULT 7) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
    today timestamptz := date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    month timestamptz := date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    d timestamptz;
    made int := 0;
BEGIN
    -- one maker at a time (the reconciler of each instance, a command)
    PERFORM pg_advisory_xact_lock(7218001);
    FOR i IN -1..days_ahead LOOP
        d := today + i * interval '1 day';
        IF tg_partition_create('usage', 'usage_p' || to_char(d AT TIME ZONE 'UTC', 'YYYYMMDD'), d,
                               d + interval '1 day') THEN
            made := made + 1;
        END IF;
    END LOOP;
    FOR i IN 0..1 LOOP
        d := month + i * interval '1 month';
        IF tg_partition_create('ledger', 'ledger_p' || to_char(d AT TIME ZONE 'UTC', 'YYYYMM'), d,
                               d + interval '1 month') THEN
            made := made + 1;
        END IF;
    END LOOP;
    RETURN made;
END $$;

-- Drops partition `name` (usage or ledger), carrying its totals forward first; returns
-- the rows it held. The legacy usage partition has no start times: it is dropped by
-- the newest settlement in it (created_at), the others by their range.
CREATE FUNCTION tg_partition_drop(pname text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    p detail_partitions;
    n bigint;
    lfloor timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(7218001);
    SELECT * INTO p FROM detail_partitions WHERE name = pname AND dropped_at IS NULL FOR UPDATE;
    IF p.name IS NULL THEN
        RAISE EXCEPTION 'no partition % to drop', pname USING ERRCODE = 'undefined_table';
    END IF;
    IF p.parent = 'usage' THEN
        -- The ledger's own floor: a usage row's ledger entry has the row's created_at
        -- (one transaction), so it is still in the ledger iff no dropped ledger
        -- partition covers that instant.
        EXECUTE format('INSERT INTO usage_carried (partition, tenant_id, api_key_id, ledger_id, requests, cost) '
                       'SELECT %L, u.tenant_id, u.api_key_id, CASE WHEN NOT EXISTS (SELECT 1 FROM detail_partitions d '
                       'WHERE d.parent = ''ledger'' AND d.dropped_at IS NOT NULL AND u.created_at >= d.lo AND '
                       'u.created_at < d.hi) THEN u.ledger_id END AS lid, count(*), sum(u.cost) FROM %I u '
                       'GROUP BY u.tenant_id, u.api_key_id, lid', p.name, p.name);
        EXECUTE format('SELECT coalesce(sum(requests), 0) FROM usage_carried WHERE partition = %L', p.name) INTO n;
    ELSE
        EXECUTE format('INSERT INTO ledger_carried (partition, tenant_id, kind, entries, amount) '
                       'SELECT %L, tenant_id, kind, count(*), sum(amount) FROM %I GROUP BY tenant_id, kind',
                       p.name, p.name);
        SELECT coalesce(sum(entries), 0) INTO n FROM ledger_carried WHERE partition = p.name;
    END IF;
    EXECUTE format('SELECT max(created_at) FROM %I', p.name) INTO lfloor;
    EXECUTE format('DROP TABLE %I', p.name);
    UPDATE detail_partitions SET dropped_at = now(), dropped_rows = n, rows_until = lfloor WHERE name = p.name;
    RETURN n;
END $$;

-- The hourly rollups (sql/0010_rollups.sql) of a settlement batch's billed requests:
-- nothing yet. Called last by tg_settle_batch (after the tenants, keys and budgets: the
-- lock order).
CREATE FUNCTION tg_usage_rollup(won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
END $$;

-- Whether a request's usage row was in a partition that is dropped (its settlement would
-- otherwise insert again, into the DEFAULT partition, and bill twice).
CREATE FUNCTION tg_usage_dropped(started timestamptz) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM detail_partitions d WHERE d.parent = 'usage' AND d.dropped_at IS NOT NULL
                   AND started >= d.lo AND started < d.hi)
$$;

-- Partitions of the days ahead now (the migration may run before any gateway).
SELECT tg_partitions_ensure(7);

-- ---- tg_settle_batch ---------------------------------------------------------------------
-- As in 0008_budgets.sql, with the usage rows keyed by (request_id, started_at): the
-- insert names the start its id carries, each lookup of a request's usage row names it
-- too (one partition probed, not every one), and a settlement whose request lies in a
-- dropped range is not billed: its outcome is 'expired' (logged by the gateway).
CREATE OR REPLACE FUNCTION tg_settle_batch(batch jsonb)
RETURNS TABLE (request_id text, outcome text) LANGUAGE plpgsql
-- The planner cannot know a batch's size; JIT-compiling a plan for 200 rows costs ~1 s.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    els tg_settle_element[];
    won tg_settle_element[]; -- the settlements that bill: the first of each request id that inserted
    lids bigint[];
    ltenants bigint[];
    dropped boolean;         -- a usage partition was ever dropped (then ranges are checked)
BEGIN
    els := ARRAY(
        SELECT ROW(x.ord, x.op, x.request_id, x.fingerprint, x.tenant_id, x.api_key_id, x.group_id, x.account_id,
                   x.model, greatest(coalesce(x.attempts, 1), 1), x.attempt, x.input, x.output, x.cache_read,
                   x.cache_write, x.reasoning, x.cost, x.amount, coalesce(x.estimated, false),
                   x.status, x.ttft_ms, x.total_ms, coalesce(x.attempt_ids, '[]'),
                   x.instance, x.state, x.note, x.created_ms)::tg_settle_element
        FROM ROWS FROM (jsonb_to_recordset(batch) AS (op text, request_id text, fingerprint text, tenant_id bigint,
                        api_key_id bigint, group_id bigint, account_id bigint, model text, attempts int, attempt int,
                        input bigint, output bigint, cache_read bigint, cache_write bigint, reasoning bigint,
                        cost numeric, amount numeric, estimated boolean, status int,
                        ttft_ms double precision, total_ms double precision, attempt_ids jsonb,
                        instance text, state text, note text, created_ms double precision))
             WITH ORDINALITY AS x(op, request_id, fingerprint, tenant_id, api_key_id, group_id, account_id, model,
                                  attempts, attempt, input, output, cache_read, cache_write, reasoning, cost,
                                  amount, estimated, status, ttft_ms, total_ms, attempt_ids,
                                  instance, state, note, created_ms, ord));
    dropped := EXISTS (SELECT 1 FROM detail_partitions d WHERE d.parent = 'usage' AND d.dropped_at IS NOT NULL);

    -- 1. One ledger entry id per tenant of the batch's settlements.
    SELECT array_agg(t.tenant_id ORDER BY t.tenant_id), array_agg(nextval('ledger_id_seq') ORDER BY t.tenant_id)
    INTO ltenants, lids
    FROM (SELECT DISTINCT e.tenant_id FROM unnest(els) e WHERE e.op IS NULL) t;

    -- 2. The usage rows, which are the dedup: the first settlement of each request id,
    -- inserted in request id order; a request id already there inserts nothing.
    WITH s AS (
        SELECT DISTINCT ON (e.request_id) e.* FROM unnest(els) e WHERE e.op IS NULL ORDER BY e.request_id, e.ord),
    ins AS (
        INSERT INTO usage AS u (request_id, tenant_id, api_key_id, group_id, account_id, model, attempts,
                                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                                reasoning_tokens, cost, estimated, status, ttft_ms, total_ms, attempt_ids,
                                fingerprint, ledger_id, started_at)
        SELECT s.request_id, s.tenant_id, s.api_key_id, s.group_id, s.account_id, s.model, s.attempts, s.input,
               s.output, s.cache_read, s.cache_write, s.reasoning, s.cost, s.estimated, s.status, s.ttft_ms,
               s.total_ms, s.attempt_ids, s.fingerprint, lids[array_position(ltenants, s.tenant_id)],
               tg_request_started(s.request_id)
        FROM s
        WHERE NOT dropped OR NOT tg_usage_dropped(tg_request_started(s.request_id))
        ORDER BY s.request_id
        ON CONFLICT (request_id, started_at) DO NOTHING
        RETURNING u.request_id)
    SELECT coalesce(array_agg(s ORDER BY s.request_id), '{}') INTO won
    FROM s JOIN ins ON ins.request_id = s.request_id;

    -- 3. Reservation rows, as in 0006.
    WITH r AS (
        SELECT DISTINCT ON (e.request_id, e.attempt)
               e.request_id AS rid, e.attempt, e.tenant_id, e.api_key_id, e.amount, e.model, e.instance,
               CASE WHEN e.state = 'pending_reconciliation' THEN 'pending_reconciliation' ELSE 'reserved' END AS state,
               e.note, coalesce(to_timestamp(e.created_ms / 1000), now()) AS created_at
        FROM unnest(els) e WHERE e.op = 'reserve'
        ORDER BY e.request_id, e.attempt, e.ord),
    s AS (
        SELECT w.request_id AS rid, g AS attempt, w.tenant_id, w.api_key_id, w.cost
        FROM unnest(won) w, generate_series(1, w.attempts) g)
    INSERT INTO reservations AS x (request_id, attempt, tenant_id, api_key_id, amount, model, instance, state,
                                   settled_cost, note, created_at)
    SELECT coalesce(r.rid, s.rid), coalesce(r.attempt, s.attempt), coalesce(r.tenant_id, s.tenant_id),
           coalesce(r.api_key_id, s.api_key_id), coalesce(r.amount, 0), r.model, r.instance,
           CASE WHEN s.rid IS NOT NULL
                  OR EXISTS (SELECT 1 FROM usage d WHERE d.request_id = r.rid
                             AND d.started_at = tg_request_started(r.rid)) THEN 'reconciled'
                ELSE r.state END,
           s.cost,
           CASE WHEN r.rid IS NULL THEN 'awaiting reservation' ELSE r.note END,
           coalesce(r.created_at, now())
    FROM r FULL JOIN s ON s.rid = r.rid AND s.attempt = r.attempt
    ORDER BY 1, 2
    ON CONFLICT (request_id, attempt) DO UPDATE SET
        amount = CASE WHEN x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation'
                      THEN EXCLUDED.amount ELSE x.amount END,
        model = CASE WHEN x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation'
                     THEN EXCLUDED.model ELSE x.model END,
        instance = CASE WHEN x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation'
                        THEN EXCLUDED.instance ELSE x.instance END,
        note = CASE WHEN x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation'
                    THEN EXCLUDED.note ELSE x.note END,
        state = CASE WHEN EXCLUDED.settled_cost IS NOT NULL THEN 'reconciled' ELSE x.state END,
        settled_cost = coalesce(EXCLUDED.settled_cost, x.settled_cost),
        updated_at = now()
    WHERE (x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation')
       OR (EXCLUDED.settled_cost IS NOT NULL AND x.state IN ('reserved', 'pending_reconciliation'));

    -- 4. Usage unknown (0004), as in 0006.
    INSERT INTO reservations AS x (request_id, attempt, tenant_id, api_key_id, amount, model, instance, state,
                                   note, created_at)
    SELECT DISTINCT ON (e.request_id, g) e.request_id, g, e.tenant_id, e.api_key_id, coalesce(e.amount, 0),
           e.model, e.instance, 'pending_reconciliation', 'awaiting reservation', now()
    FROM unnest(els) e, generate_series(1, greatest(coalesce(e.attempts, 0), 0)) g
    WHERE e.op = 'unknown' AND e.tenant_id IS NOT NULL AND e.api_key_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM usage d WHERE d.request_id = e.request_id
                      AND d.started_at = tg_request_started(e.request_id))
    ORDER BY e.request_id, g
    ON CONFLICT (request_id, attempt) DO NOTHING;
    UPDATE reservations x SET state = 'pending_reconciliation', note = 'usage unknown', updated_at = now()
    FROM (SELECT DISTINCT e.request_id AS rid FROM unnest(els) e WHERE e.op = 'unknown') u
    WHERE x.request_id = u.rid AND x.state = 'reserved';

    -- 5. The ledger: one entry per tenant, minus the sum of its billed costs.
    INSERT INTO ledger (id, tenant_id, kind, amount, note)
    SELECT lids[array_position(ltenants, w.tenant_id)], w.tenant_id, 'usage', -sum(w.cost),
           count(*) || ' request(s), see usage.ledger_id'
    FROM unnest(won) w GROUP BY w.tenant_id ORDER BY w.tenant_id;

    -- 6. Balances and spend: one row update per tenant and per key, locked in id order.
    PERFORM 1 FROM tenants WHERE id IN (SELECT w.tenant_id FROM unnest(won) w) ORDER BY id FOR NO KEY UPDATE;
    UPDATE tenants t SET balance = t.balance - a.c, spend = t.spend + a.c, updated_at = now()
    FROM (SELECT w.tenant_id, sum(w.cost) AS c FROM unnest(won) w GROUP BY w.tenant_id) a
    WHERE t.id = a.tenant_id;
    PERFORM 1 FROM api_keys WHERE id IN (SELECT w.api_key_id FROM unnest(won) w) ORDER BY id FOR NO KEY UPDATE;
    UPDATE api_keys k SET spend = k.spend + a.c
    FROM (SELECT w.api_key_id, sum(w.cost) AS c FROM unnest(won) w GROUP BY w.api_key_id) a
    WHERE k.id = a.api_key_id;

    -- 6b. Periodic budgets (0008_budgets.sql).
    PERFORM tg_budget_settle(batch, won);
    -- 6c. The hourly rollups (0010_rollups.sql): one aggregated upsert for the batch.
    PERFORM tg_usage_rollup(won);

    -- 7. One outcome per element, in order.
    RETURN QUERY
    SELECT e.request_id,
           CASE WHEN e.op = 'reserve' THEN 'reserved'
                WHEN e.op = 'unknown' THEN 'unknown'
                WHEN w.ord = e.ord THEN 'settled'
                WHEN dropped AND w.ord IS NULL AND tg_usage_dropped(tg_request_started(e.request_id)) THEN 'expired'
                WHEN coalesce(w.fingerprint, (SELECT u.fingerprint FROM usage u WHERE u.request_id = e.request_id
                                              AND u.started_at = tg_request_started(e.request_id)))
                     IS NOT DISTINCT FROM e.fingerprint THEN 'duplicate'
                ELSE 'conflict' END
    FROM unnest(els) e
    LEFT JOIN unnest(won) w ON e.op IS NULL AND w.request_id = e.request_id
    ORDER BY e.ord;
END $$;
