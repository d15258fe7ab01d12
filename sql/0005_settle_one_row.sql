-- One row per billed request (issue #17, goal 3). Until now a billed request wrote four
-- rows — its dedup row, its reservation row (then updated to `reconciled`), its usage row
-- and its ledger row. Now, on the normal path, only the usage row:
--
--   * the dedup is the usage row's own key: `usage.request_id` is UNIQUE, so the
--     settlement inserts it ON CONFLICT DO NOTHING, and only a request id it inserted
--     bills; `usage.fingerprint` (was billing_dedup.fingerprint) tells a duplicate from a
--     conflict. billing_dedup becomes a view over usage, for readers.
--   * a request whose holds are in Redis has no reservation row: Redis holds the money
--     and indexes the hold ({t:T}:holds), so the reconciler finds the hold of a gateway
--     that died before settling (it writes the row then, `orphaned hold`). Rows remain
--     where Redis has nothing to find: an attempt that went ahead without a hold (money
--     open, note 'unheld'), a usage-unknown request (pending_reconciliation) and the
--     reconciler's own. `usage.reserved` keeps the bound each attempt held.
--   * ledger entries of kind 'usage' are one per tenant per batch (request_id NULL, the
--     count in `note`); each usage row names its entry (`usage.ledger_id`), and the
--     entry's amount is minus the sum of their costs. Balances and spend were already
--     one update per tenant and per key per batch.
--
-- tg_settle_batch keeps its signature and its elements (README, Billing; 0003, 0004), so
-- a spool written before this migration replays as it is: a settlement element without
-- "held": true is settled as before, its reservation rows written or reconciled. The
-- batch is read once (jsonb_to_recordset into an array) instead of once per statement.

ALTER TABLE usage
    ADD COLUMN fingerprint text,
    ADD COLUMN reserved numeric(24, 10),
    ADD COLUMN ledger_id bigint;

-- The dedup rows move into their usage rows (one each: both were written by the same
-- transaction); usage rows are immutable, so the trigger is off for this copy only.
ALTER TABLE usage DISABLE TRIGGER usage_immutable;
UPDATE usage u SET fingerprint = d.fingerprint FROM billing_dedup d WHERE d.request_id = u.request_id;
ALTER TABLE usage ENABLE TRIGGER usage_immutable;
DROP TABLE billing_dedup;
CREATE VIEW billing_dedup AS SELECT request_id, api_key_id, fingerprint, created_at FROM usage;

-- One element of a batch, as read once.
CREATE TYPE tg_settle_element AS (
    ord bigint, op text, request_id text, fingerprint text, tenant_id bigint, api_key_id bigint,
    group_id bigint, account_id bigint, model text, attempts int, attempt int,
    input bigint, output bigint, cache_read bigint, cache_write bigint, reasoning bigint,
    cost numeric, reserved numeric, amount numeric, estimated boolean, status int,
    ttft_ms double precision, total_ms double precision, attempt_ids jsonb, held boolean,
    instance text, state text, note text, created_ms double precision);

DROP FUNCTION tg_settle_batch(jsonb);
DROP FUNCTION tg_settling(jsonb);

CREATE FUNCTION tg_settle_batch(batch jsonb)
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
    rows_path boolean;
BEGIN
    els := ARRAY(
        SELECT ROW(x.ord, x.op, x.request_id, x.fingerprint, x.tenant_id, x.api_key_id, x.group_id, x.account_id,
                   x.model, greatest(coalesce(x.attempts, 1), 1), x.attempt, x.input, x.output, x.cache_read,
                   x.cache_write, x.reasoning, x.cost, x.reserved, x.amount, coalesce(x.estimated, false),
                   x.status, x.ttft_ms, x.total_ms, coalesce(x.attempt_ids, '[]'), coalesce(x.held, false),
                   x.instance, x.state, x.note, x.created_ms)::tg_settle_element
        FROM ROWS FROM (jsonb_to_recordset(batch) AS (op text, request_id text, fingerprint text, tenant_id bigint,
                        api_key_id bigint, group_id bigint, account_id bigint, model text, attempts int, attempt int,
                        input bigint, output bigint, cache_read bigint, cache_write bigint, reasoning bigint,
                        cost numeric, reserved numeric, amount numeric, estimated boolean, status int,
                        ttft_ms double precision, total_ms double precision, attempt_ids jsonb, held boolean,
                        instance text, state text, note text, created_ms double precision))
             WITH ORDINALITY AS x(op, request_id, fingerprint, tenant_id, api_key_id, group_id, account_id, model,
                                  attempts, attempt, input, output, cache_read, cache_write, reasoning, cost,
                                  reserved, amount, estimated, status, ttft_ms, total_ms, attempt_ids, held,
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
                                fingerprint, reserved, ledger_id)
        SELECT s.request_id, s.tenant_id, s.api_key_id, s.group_id, s.account_id, s.model, s.attempts, s.input,
               s.output, s.cache_read, s.cache_write, s.reasoning, s.cost, s.estimated, s.status, s.ttft_ms,
               s.total_ms, s.attempt_ids, s.fingerprint, s.reserved,
               lids[array_position(ltenants, s.tenant_id)]
        FROM s ORDER BY s.request_id
        ON CONFLICT (request_id) DO NOTHING
        RETURNING u.request_id)
    SELECT coalesce(array_agg(s ORDER BY s.request_id), '{}') INTO won
    FROM s JOIN ins ON ins.request_id = s.request_id;

    -- 3. Reservation rows, only where there are any: elements of the rows path (a
    -- reservation row, a usage-unknown request, a settlement without "held") as before
    -- (0003, 0004: a settlement arriving before its reservation row writes it,
    -- `awaiting reservation`; every write goes through the (request_id, attempt) key).
    rows_path := EXISTS (SELECT 1 FROM unnest(els) e WHERE e.op IS NOT NULL)
                 OR EXISTS (SELECT 1 FROM unnest(won) w WHERE NOT w.held);
    IF rows_path THEN
        WITH r AS (
            SELECT DISTINCT ON (e.request_id, e.attempt)
                   e.request_id AS rid, e.attempt, e.tenant_id, e.api_key_id, e.amount, e.model, e.instance,
                   CASE WHEN e.state = 'pending_reconciliation' THEN 'pending_reconciliation' ELSE 'reserved' END AS state,
                   e.note, coalesce(to_timestamp(e.created_ms / 1000), now()) AS created_at
            FROM unnest(els) e WHERE e.op = 'reserve'
            ORDER BY e.request_id, e.attempt, e.ord),
        s AS (
            SELECT w.request_id AS rid, g AS attempt, w.tenant_id, w.api_key_id, w.cost
            FROM unnest(won) w, generate_series(1, w.attempts) g WHERE NOT w.held)
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
    END IF;

    -- A held request has no row of its own, but the reconciler may have written one for
    -- its hold (its gateway stopped heart-beating before the settlement landed): that
    -- row is reconciled now (one index probe per request; the reconciler's pass repairs
    -- a row it wrote concurrently with this transaction).
    UPDATE reservations x SET state = 'reconciled', settled_cost = CASE WHEN x.attempt = w.attempts THEN w.cost ELSE 0 END,
                              updated_at = now()
    FROM unnest(won) w
    WHERE w.held AND x.request_id = w.request_id AND x.state <> 'reconciled';

    -- 4. The ledger: one entry per tenant, minus the sum of its billed costs.
    INSERT INTO ledger (id, tenant_id, kind, amount, note)
    SELECT lids[array_position(ltenants, w.tenant_id)], w.tenant_id, 'usage', -sum(w.cost),
           count(*) || ' request(s), see usage.ledger_id'
    FROM unnest(won) w GROUP BY w.tenant_id ORDER BY w.tenant_id;

    -- 5. Balances and spend: one row update per tenant and per key, locked in id order.
    PERFORM 1 FROM tenants WHERE id IN (SELECT w.tenant_id FROM unnest(won) w) ORDER BY id FOR NO KEY UPDATE;
    UPDATE tenants t SET balance = t.balance - a.c, spend = t.spend + a.c, updated_at = now()
    FROM (SELECT w.tenant_id, sum(w.cost) AS c FROM unnest(won) w GROUP BY w.tenant_id) a
    WHERE t.id = a.tenant_id;
    PERFORM 1 FROM api_keys WHERE id IN (SELECT w.api_key_id FROM unnest(won) w) ORDER BY id FOR NO KEY UPDATE;
    UPDATE api_keys k SET spend = k.spend + a.c
    FROM (SELECT w.api_key_id, sum(w.cost) AS c FROM unnest(won) w GROUP BY w.api_key_id) a
    WHERE k.id = a.api_key_id;

    -- 6. One outcome per element, in order.
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
