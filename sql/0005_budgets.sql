-- Periodic budgets (issue #24): spend limits per key, per user (a key's user_id) and per
-- tenant, by calendar day, ISO week or month in an IANA time zone, or by windows of N
-- hours counted from the budget's creation. The gateway enforces them in Redis, in the
-- admission script that reserves the balance (see README "Budgets"); Postgres keeps each
-- period's spend per budget, written by the settlement batch (tg_budget_settle, called
-- by tg_settle_batch below), so `tollgate ledger verify` can check that a period's usage
-- adds up to its recorded spend.

CREATE TABLE budgets (
    id              bigserial PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    tenant_id       bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    api_key_id      bigint REFERENCES api_keys (id) ON DELETE CASCADE,  -- a key's budget
    user_id         bigint REFERENCES users (id) ON DELETE CASCADE,     -- every key of a user
    amount          numeric(24, 10) NOT NULL CHECK (amount >= 0 AND amount <= 1000000000),
    period          text NOT NULL CHECK (period IN ('day', 'week', 'month', 'hours')),
    period_hours    integer CHECK (period_hours BETWEEN 1 AND 8784),
    timezone        text NOT NULL DEFAULT 'UTC' CHECK (length(timezone) BETWEEN 1 AND 64),
    thresholds      integer[] NOT NULL DEFAULT '{50,80,100}',
    webhook_url     text,
    webhook_secret  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT budgets_scope_check CHECK (api_key_id IS NULL OR user_id IS NULL),
    CONSTRAINT budgets_period_hours_check2 CHECK ((period = 'hours') = (period_hours IS NOT NULL))
);
CREATE INDEX budgets_tenant ON budgets (tenant_id);
CREATE INDEX budgets_key ON budgets (api_key_id) WHERE api_key_id IS NOT NULL;
CREATE INDEX budgets_user ON budgets (user_id) WHERE user_id IS NOT NULL;

-- A key's or user's budget belongs to that key's or user's tenant (the gateway keeps it
-- under the tenant's Redis hash tag): the tenant is taken from them, and a different
-- tenant_id given with them is refused.
CREATE FUNCTION tg_budget_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    owner bigint;
BEGIN
    IF NEW.api_key_id IS NOT NULL THEN
        SELECT tenant_id INTO owner FROM api_keys WHERE id = NEW.api_key_id;
    ELSIF NEW.user_id IS NOT NULL THEN
        SELECT tenant_id INTO owner FROM users WHERE id = NEW.user_id;
    ELSIF NEW.tenant_id IS NULL THEN
        RAISE EXCEPTION 'a budget needs a tenant_id, an api_key_id or a user_id'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'budgets_owner_check';
    ELSE
        RETURN NEW;
    END IF;
    IF owner IS NULL THEN
        RETURN NEW; -- the foreign key refuses it
    END IF;
    IF TG_OP = 'INSERT' AND NEW.tenant_id IS NULL THEN
        NEW.tenant_id := owner;
    ELSIF NEW.tenant_id IS DISTINCT FROM owner THEN
        RAISE EXCEPTION 'the key or user belongs to tenant %, not %', owner, NEW.tenant_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'budgets_tenant_check';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER budgets_tenant BEFORE INSERT OR UPDATE ON budgets
    FOR EACH ROW EXECUTE FUNCTION tg_budget_tenant();

-- Each period's spend per budget: the sum of the costs of the requests admitted in that
-- period (budget_usage), written by the settlement batch. No foreign key: a budget
-- deleted while its requests settle must not make their batch fail; its history stays.
CREATE TABLE budget_periods (
    budget_id     bigint NOT NULL,
    period_start  timestamptz NOT NULL,
    spend         numeric(24, 10) NOT NULL DEFAULT 0,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (budget_id, period_start)
);

-- Which period of which budget a billed request counted in (the period its last attempt
-- was admitted in): one row per request and budget.
CREATE TABLE budget_usage (
    request_id    text NOT NULL,
    budget_id     bigint NOT NULL,
    period_start  timestamptz NOT NULL,
    cost          numeric(24, 10) NOT NULL,
    PRIMARY KEY (request_id, budget_id)
);
CREATE INDEX budget_usage_period ON budget_usage (budget_id, period_start);

-- Alerts: each threshold of a budget fires once per period (the primary key is the
-- dedupe), delivered to the budget's webhook, signed, with retries; every attempt logged.
CREATE TABLE budget_alerts (
    budget_id     bigint NOT NULL,
    period_start  timestamptz NOT NULL,
    threshold     integer NOT NULL,
    spend         numeric(24, 10) NOT NULL,
    amount        numeric(24, 10) NOT NULL,
    state         text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed', 'no_webhook')),
    attempts      integer NOT NULL DEFAULT 0,
    next_at       timestamptz NOT NULL DEFAULT now(),
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz,
    PRIMARY KEY (budget_id, period_start, threshold)
);
CREATE TABLE budget_alert_deliveries (
    id            bigserial PRIMARY KEY,
    budget_id     bigint NOT NULL,
    period_start  timestamptz NOT NULL,
    threshold     integer NOT NULL,
    attempt       integer NOT NULL,
    status        integer,          -- the receiver's HTTP status; NULL: no answer
    error         text,
    at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX budget_alert_deliveries_alert ON budget_alert_deliveries (budget_id, period_start, threshold);

-- The settlements of a batch that bill (tg_settling): each carries "budgets": [[budget
-- id, period start in Unix seconds], ...] (the gateway computed the periods at admission).
-- One insert of budget_usage rows, one upsert per (budget, period), locked in key order.
CREATE FUNCTION tg_budget_settle(settling jsonb) RETURNS void LANGUAGE sql AS $$
    WITH u AS (
        SELECT st.rid, (b->>0)::bigint AS bid, to_timestamp((b->>1)::bigint) AS ps, st.cost
        FROM tg_settling(settling) st,
             jsonb_array_elements(CASE WHEN jsonb_typeof(st.e->'budgets') = 'array' THEN st.e->'budgets' ELSE '[]' END) b),
    ins AS (
        INSERT INTO budget_usage (request_id, budget_id, period_start, cost)
        SELECT rid, bid, ps, cost FROM u ORDER BY rid, bid
        ON CONFLICT DO NOTHING
        RETURNING budget_id, period_start, cost),
    up AS (
        INSERT INTO budget_periods AS p (budget_id, period_start, spend)
        SELECT budget_id, period_start, sum(cost) FROM ins GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (budget_id, period_start) DO UPDATE SET spend = p.spend + EXCLUDED.spend, updated_at = now()
        RETURNING p.budget_id, p.period_start, p.spend)
    -- Alerts: each threshold the period's spend has reached, once per period (the primary
    -- key); delivered by the reconciler (tg_budget_alerts.c).
    INSERT INTO budget_alerts (budget_id, period_start, threshold, spend, amount, state)
    SELECT up.budget_id, up.period_start, th, up.spend, b.amount,
           CASE WHEN b.webhook_url IS NULL THEN 'no_webhook' ELSE 'pending' END
    FROM up JOIN budgets b ON b.id = up.budget_id, unnest(b.thresholds) th
    WHERE up.spend * 100 >= b.amount * th
    ORDER BY 1, 2, 3
    ON CONFLICT DO NOTHING;
$$;

-- The period of budget b that contains `at`, as the gateway computes it (tg_budgets.c):
-- calendar day, ISO week (from Monday) or month in b's time zone, or windows of
-- period_hours from its creation (to the second).
CREATE FUNCTION tg_budget_period(b budgets, at timestamptz, OUT period_start timestamptz, OUT period_end timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN b.period = 'hours' THEN
                    to_timestamp(floor(extract(epoch FROM b.created_at)) + floor((extract(epoch FROM at) -
                        floor(extract(epoch FROM b.created_at))) / (b.period_hours * 3600)) * b.period_hours * 3600)
                ELSE date_trunc(b.period, at AT TIME ZONE b.timezone) AT TIME ZONE b.timezone END,
           CASE WHEN b.period = 'hours' THEN
                    to_timestamp(floor(extract(epoch FROM b.created_at)) + (floor((extract(epoch FROM at) -
                        floor(extract(epoch FROM b.created_at))) / (b.period_hours * 3600)) + 1) * b.period_hours * 3600)
                ELSE (date_trunc(b.period, at AT TIME ZONE b.timezone) + ('1 ' || b.period)::interval)
                     AT TIME ZONE b.timezone END
$$;

-- A budget as the admin API shows it with a key: its scope and, for the period now, the
-- settled spend, what remains and when it resets (a request in flight holds part of the
-- rest in Redis until it settles).
CREATE FUNCTION tg_budget_json(b budgets) RETURNS json LANGUAGE sql STABLE AS $$
    SELECT json_build_object('id', b.id, 'name', b.name, 'tenant_id', b.tenant_id, 'api_key_id', b.api_key_id,
        'user_id', b.user_id,
        'scope', CASE WHEN b.api_key_id IS NOT NULL THEN 'key' WHEN b.user_id IS NOT NULL THEN 'user' ELSE 'tenant' END,
        'amount', b.amount, 'period', b.period, 'period_hours', b.period_hours, 'timezone', b.timezone,
        'thresholds', b.thresholds,
        'current', json_build_object('start', p.period_start, 'end', p.period_end, 'resets_at', p.period_end,
            'spend', coalesce(bp.spend, 0), 'remaining', greatest(b.amount - coalesce(bp.spend, 0), 0)))
    FROM tg_budget_period(b, now()) p
    LEFT JOIN budget_periods bp ON bp.budget_id = b.id AND bp.period_start = p.period_start
$$;


-- tg_settle_batch as in 0004_money.sql, with step 5b (tg_budget_settle) added.
CREATE OR REPLACE FUNCTION tg_settle_batch(batch jsonb)
RETURNS TABLE (request_id text, outcome text) LANGUAGE plpgsql
-- The planner cannot know a batch's size (generate_series over attempts, JSON arrays)
-- and may guess it huge; JIT-compiling a plan for 200 rows then costs ~1 s. Never worth it.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    won text[];
    settling jsonb; -- the settlements that bill, one per request id
BEGIN
    -- 1. The dedup rows: the first settlement of each request id in the batch.
    WITH s AS (
        SELECT DISTINCT ON (e->>'request_id') e->>'request_id' AS rid, (e->>'api_key_id')::bigint AS kid,
               e->>'fingerprint' AS fp
        FROM jsonb_array_elements(batch) WITH ORDINALITY AS a(e, ord)
        WHERE e->>'op' IS NULL
        ORDER BY e->>'request_id', ord),
    ins AS (
        INSERT INTO billing_dedup (request_id, api_key_id, fingerprint)
        SELECT rid, kid, fp FROM s ORDER BY rid
        ON CONFLICT DO NOTHING
        RETURNING billing_dedup.request_id)
    SELECT coalesce(array_agg(ins.request_id), '{}') INTO won FROM ins;

    -- The settlements that bill: the first element of each request id that inserted
    -- (kept in a variable: a temporary table costs a truncation at every commit).
    SELECT coalesce(jsonb_agg(x.e ORDER BY x.rid), '[]') INTO settling
    FROM (SELECT DISTINCT ON (e->>'request_id') e->>'request_id' AS rid, e
          FROM jsonb_array_elements(batch) WITH ORDINALITY AS a(e, ord)
          JOIN unnest(won) AS w(rid) ON w.rid = e->>'request_id'
          WHERE e->>'op' IS NULL
          ORDER BY e->>'request_id', ord) x;

    -- 2. Reservation rows, one statement: each (request, attempt) gets its reservation
    -- (from a reserve element) and/or its settlement (from a billed settlement).
    WITH r AS (
        SELECT DISTINCT ON (e->>'request_id', (e->>'attempt')::int)
               e->>'request_id' AS rid, (e->>'attempt')::int AS attempt, (e->>'tenant_id')::bigint AS tenant_id,
               (e->>'api_key_id')::bigint AS api_key_id, (e->>'amount')::numeric AS amount, e->>'model' AS model,
               e->>'instance' AS instance,
               CASE WHEN e->>'state' = 'pending_reconciliation' THEN 'pending_reconciliation' ELSE 'reserved' END AS state,
               e->>'note' AS note,
               coalesce(to_timestamp((e->>'created_ms')::double precision / 1000), now()) AS created_at
        FROM jsonb_array_elements(batch) WITH ORDINALITY AS a(e, ord)
        WHERE e->>'op' = 'reserve'
        ORDER BY e->>'request_id', (e->>'attempt')::int, ord),
    s AS (
        SELECT st.rid, g AS attempt, st.tenant_id, st.api_key_id, st.cost
        FROM tg_settling(settling) st, generate_series(1, st.attempts) g)
    INSERT INTO reservations AS x (request_id, attempt, tenant_id, api_key_id, amount, model, instance, state,
                                   settled_cost, note, created_at)
    SELECT coalesce(r.rid, s.rid), coalesce(r.attempt, s.attempt), coalesce(r.tenant_id, s.tenant_id),
           coalesce(r.api_key_id, s.api_key_id), coalesce(r.amount, 0), r.model, r.instance,
           CASE WHEN s.rid IS NOT NULL
                  OR EXISTS (SELECT 1 FROM billing_dedup d WHERE d.request_id = r.rid) THEN 'reconciled'
                ELSE r.state END,
           s.cost,
           CASE WHEN r.rid IS NULL THEN 'awaiting reservation' ELSE r.note END,
           coalesce(r.created_at, now())
    FROM r FULL JOIN s ON s.rid = r.rid AND s.attempt = r.attempt
    ORDER BY 1, 2
    ON CONFLICT (request_id, attempt) DO UPDATE SET
        -- a reservation arriving for a row its settlement wrote first
        amount = CASE WHEN x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation'
                      THEN EXCLUDED.amount ELSE x.amount END,
        model = CASE WHEN x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation'
                     THEN EXCLUDED.model ELSE x.model END,
        instance = CASE WHEN x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation'
                        THEN EXCLUDED.instance ELSE x.instance END,
        note = CASE WHEN x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation'
                    THEN EXCLUDED.note ELSE x.note END,
        -- a settlement for a row reserved earlier
        state = CASE WHEN EXCLUDED.settled_cost IS NOT NULL THEN 'reconciled' ELSE x.state END,
        settled_cost = coalesce(EXCLUDED.settled_cost, x.settled_cost),
        updated_at = now()
    WHERE (x.note = 'awaiting reservation' AND EXCLUDED.note IS DISTINCT FROM 'awaiting reservation')
       OR (EXCLUDED.settled_cost IS NOT NULL AND x.state IN ('reserved', 'pending_reconciliation'));

    -- 3. Usage unknown: the reservations wait for the reconciler. A reservation row not
    -- in Postgres yet (in another batch in flight, or in the spool) is written now from
    -- what the element carries, already pending_reconciliation, with the note
    -- 'awaiting reservation' (its reservation, when it comes, fills it in and leaves the
    -- state alone); before, the update found no row and the row arrived `reserved`.
    INSERT INTO reservations AS x (request_id, attempt, tenant_id, api_key_id, amount, model, instance, state, note,
                                   created_at)
    SELECT DISTINCT ON (e->>'request_id', g) e->>'request_id', g, (e->>'tenant_id')::bigint,
           (e->>'api_key_id')::bigint, coalesce((e->>'amount')::numeric, 0), e->>'model', e->>'instance',
           'pending_reconciliation', 'awaiting reservation', now()
    FROM jsonb_array_elements(batch) e, generate_series(1, greatest(coalesce((e->>'attempts')::int, 0), 0)) g
    WHERE e->>'op' = 'unknown' AND e ? 'tenant_id' AND e ? 'api_key_id'
      AND NOT EXISTS (SELECT 1 FROM billing_dedup d WHERE d.request_id = e->>'request_id')
    ORDER BY e->>'request_id', g
    ON CONFLICT (request_id, attempt) DO NOTHING;
    UPDATE reservations x SET state = 'pending_reconciliation', note = 'usage unknown', updated_at = now()
    FROM (SELECT DISTINCT e->>'request_id' AS rid FROM jsonb_array_elements(batch) e WHERE e->>'op' = 'unknown') u
    WHERE x.request_id = u.rid AND x.state = 'reserved';

    -- 4. The immutable usage rows and the ledger rows.
    INSERT INTO usage (request_id, tenant_id, api_key_id, group_id, account_id, model, attempts,
                       input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                       reasoning_tokens, cost, estimated, status, ttft_ms, total_ms, attempt_ids)
    SELECT st.rid, st.tenant_id, st.api_key_id, (e->>'group_id')::bigint, (e->>'account_id')::bigint, e->>'model',
           st.attempts, (e->>'input')::bigint, (e->>'output')::bigint, (e->>'cache_read')::bigint,
           (e->>'cache_write')::bigint, (e->>'reasoning')::bigint, st.cost,
           coalesce((e->>'estimated')::boolean, false), (e->>'status')::int,
           (e->>'ttft_ms')::double precision, (e->>'total_ms')::double precision, coalesce(e->'attempt_ids', '[]')
    FROM tg_settling(settling) st;
    INSERT INTO ledger (tenant_id, kind, amount, request_id)
    SELECT st.tenant_id, 'usage', -st.cost, st.rid FROM tg_settling(settling) st;

    -- 5. Balances and spend: one row update per tenant and per key, locked in id order.
    PERFORM 1 FROM tenants WHERE id IN (SELECT st.tenant_id FROM tg_settling(settling) st) ORDER BY id FOR NO KEY UPDATE;
    UPDATE tenants t SET balance = t.balance - a.c, spend = t.spend + a.c, updated_at = now()
    FROM (SELECT st.tenant_id, sum(st.cost) AS c FROM tg_settling(settling) st GROUP BY st.tenant_id) a
    WHERE t.id = a.tenant_id;
    PERFORM 1 FROM api_keys WHERE id IN (SELECT st.api_key_id FROM tg_settling(settling) st) ORDER BY id FOR NO KEY UPDATE;
    UPDATE api_keys k SET spend = k.spend + a.c
    FROM (SELECT st.api_key_id, sum(st.cost) AS c FROM tg_settling(settling) st GROUP BY st.api_key_id) a
    WHERE k.id = a.api_key_id;

    -- 5b. Periodic budgets (0005_budgets.sql): each billed request's cost in the periods
    -- of the budgets it was admitted against, after the tenants and keys (lock order).
    PERFORM tg_budget_settle(settling);

    -- 6. One outcome per element, in order.
    RETURN QUERY
    SELECT e->>'request_id',
           CASE WHEN e->>'op' = 'reserve' THEN 'reserved'
                WHEN e->>'op' = 'unknown' THEN 'unknown'
                WHEN e->>'request_id' = ANY (won) AND ord = min(ord) OVER (PARTITION BY e->>'request_id', e->>'op')
                     THEN 'settled'
                WHEN d.fingerprint = e->>'fingerprint' THEN 'duplicate'
                ELSE 'conflict' END
    FROM jsonb_array_elements(batch) WITH ORDINALITY AS a(e, ord)
    LEFT JOIN billing_dedup d ON e->>'op' IS NULL AND d.request_id = e->>'request_id'
    ORDER BY ord;
END $$;
