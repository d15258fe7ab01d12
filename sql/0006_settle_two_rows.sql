-- Fewer rows per billed request (issue #17, goal 3, first step). A settled request wrote
-- four rows — its dedup row, its reservation row, its usage row, its ledger row. Now two:
--
--   * the dedup is the usage row's own key: `usage.request_id` is UNIQUE, so the
--     settlement inserts it ON CONFLICT DO NOTHING, and only a request id it inserted
--     bills; `usage.fingerprint` (was billing_dedup.fingerprint) tells a duplicate from a
--     conflict. billing_dedup becomes a view over usage, for readers.
--   * ledger entries of kind 'usage' are one per tenant per batch (request_id NULL, the
--     count in `note`); each usage row names its entry (`usage.ledger_id`), and the
--     entry's amount is minus the sum of their costs (`tollgate ledger verify` checks
--     both). Balances and spend were already one update per tenant and per key per batch.
--
-- The reservation rows stay as they were (0003, 0004): a request's row is what the live
-- balance loaded from Postgres subtracts while it is in flight, and what the reconciler
-- settles when its gateway dies; a row and its settlement in one batch are one insert.
-- tg_settle_batch keeps its signature and its elements, so a spool written before this
-- migration replays as it is. The batch is read once (jsonb_to_recordset into an array)
-- instead of once per statement.

ALTER TABLE usage
    ADD COLUMN fingerprint text,
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
    cost numeric, amount numeric, estimated boolean, status int,
    ttft_ms double precision, total_ms double precision, attempt_ids jsonb,
    instance text, state text, note text, created_ms double precision);

DROP FUNCTION tg_settle_batch(jsonb);
DROP FUNCTION tg_settling(jsonb);

-- Elements as in 0003 and 0004. Returns one row per element, in order: 'reserved' /
-- 'unknown', or for a settlement 'settled', 'duplicate' (settled before, same
-- fingerprint) or 'conflict' (settled before with a different fingerprint: logged
-- loudly by the caller, never billed twice). Row locks in one global order: usage rows
-- by request id (where the dedup rows were), reservation rows by (request id, attempt),
-- the ledger, then tenants and keys by id, last.
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
