-- Periodic budgets (issue #24): spend limits per key, per user (a key's user_id) and per
-- tenant, by calendar day, ISO week or month in an IANA time zone, or by windows of N
-- hours counted from the budget's creation. The gateway enforces them in Redis, in the
-- admission script that reserves the balance (see README "Budgets"); Postgres keeps each
-- period's spend per budget, written by the settlement batch (tg_budget_settle, called
-- by tg_settle_batch below, which is 0006's with that one call added), so `tollgate ledger verify` can check that a period's usage
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

-- The settlements of a batch that bill (tg_settle_batch's `won`, 0006): each element of
-- the batch carries "budgets": [[budget id, period start in Unix seconds], ...] (the
-- gateway computed the periods at admission), read here from the batch by the element's
-- position. One insert of budget_usage rows, one upsert per (budget, period), locked in
-- key order, and the alerts its spend has reached.
CREATE FUNCTION tg_budget_settle(batch jsonb, won tg_settle_element[]) RETURNS void LANGUAGE sql AS $$
    WITH u AS (
        SELECT w.request_id AS rid, (b->>0)::bigint AS bid, to_timestamp((b->>1)::bigint) AS ps, w.cost
        FROM unnest(won) w,
             jsonb_array_elements(CASE WHEN jsonb_typeof(batch->(w.ord::int - 1)->'budgets') = 'array'
                                       THEN batch->(w.ord::int - 1)->'budgets' ELSE '[]' END) b),
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


-- tg_settle_batch as in 0006_settle_two_rows.sql, with step 6b (tg_budget_settle) added.
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

    -- 1. One ledger entry id per tenant of the batch's settlements (an id not used, when
    -- none of a tenant's settlements bills, is a gap in the sequence, nothing more).
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
                                fingerprint, ledger_id)
        SELECT s.request_id, s.tenant_id, s.api_key_id, s.group_id, s.account_id, s.model, s.attempts, s.input,
               s.output, s.cache_read, s.cache_write, s.reasoning, s.cost, s.estimated, s.status, s.ttft_ms,
               s.total_ms, s.attempt_ids, s.fingerprint, lids[array_position(ltenants, s.tenant_id)]
        FROM s ORDER BY s.request_id
        ON CONFLICT (request_id) DO NOTHING
        RETURNING u.request_id)
    SELECT coalesce(array_agg(s ORDER BY s.request_id), '{}') INTO won
    FROM s JOIN ins ON ins.request_id = s.request_id;

    -- 3. Reservation rows, one statement: each (request, attempt) gets its reservation
    -- (from a reserve element) and/or its settlement (from a billed settlement), as in
    -- 0003 (a settlement arriving before its reservation row writes it, `awaiting
    -- reservation`; every write goes through the (request_id, attempt) key).
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
                  OR EXISTS (SELECT 1 FROM usage d WHERE d.request_id = r.rid) THEN 'reconciled'
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

    -- 4. Usage unknown (0004): the reservation rows not in Postgres yet are written
    -- pending_reconciliation from what the element carries; open ones become so.
    INSERT INTO reservations AS x (request_id, attempt, tenant_id, api_key_id, amount, model, instance, state,
                                   note, created_at)
    SELECT DISTINCT ON (e.request_id, g) e.request_id, g, e.tenant_id, e.api_key_id, coalesce(e.amount, 0),
           e.model, e.instance, 'pending_reconciliation', 'awaiting reservation', now()
    FROM unnest(els) e, generate_series(1, greatest(coalesce(e.attempts, 0), 0)) g
    WHERE e.op = 'unknown' AND e.tenant_id IS NOT NULL AND e.api_key_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM usage d WHERE d.request_id = e.request_id)
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

    -- 6b. Periodic budgets (0008_budgets.sql): each billed request's cost in the periods
    -- of the budgets it was admitted against, after the tenants and keys (lock order).
    PERFORM tg_budget_settle(batch, won);

    -- 7. One outcome per element, in order.
    RETURN QUERY
    SELECT e.request_id,
           CASE WHEN e.op = 'reserve' THEN 'reserved'
                WHEN e.op = 'unknown' THEN 'unknown'
                WHEN w.ord = e.ord THEN 'settled'
                WHEN coalesce(w.fingerprint, (SELECT u.fingerprint FROM usage u WHERE u.request_id = e.request_id))
                     IS NOT DISTINCT FROM e.fingerprint THEN 'duplicate'
                ELSE 'conflict' END
    FROM unnest(els) e
    LEFT JOIN unnest(won) w ON e.op IS NULL AND w.request_id = e.request_id
    ORDER BY e.ord;
END $$;
