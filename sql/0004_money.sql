-- Money hardening (issue #14).
--
-- tg_settle_batch, again: an {"op": "unknown"} element (usage unknown: the upstream timed
-- out or reset after the request was sent) now carries what its reservation rows hold
-- (tenant_id, api_key_id, attempts, amount per attempt, model, instance). Batches are
-- applied in any order (two in flight per worker, the spool replayed later), and an
-- unknown element that committed before its reservation row found nothing to mark:
-- the row then arrived `reserved` and stayed so (ledger verify failed until a manual
-- reconcile). Now it writes the rows itself, pending_reconciliation, like a settlement
-- that arrives first; everything else is as in 0003_billing.sql.

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
