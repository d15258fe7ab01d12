-- pipeline (#17, goal 3): one Postgres row per billed request on the normal path.
--
-- Since 0006 a billed request wrote two rows: its usage row (its own dedup) and its
-- reservation row — inserted already `reconciled` when the reservation and the
-- settlement came in the same batch, which under load is nearly every request. That row
-- records nothing Postgres needs: a reservation row stands for money in flight (the
-- reload of a live balance subtracts the open ones, the reconciler settles those whose
-- gateway died, `ledger verify` flags those left `reserved`), and a request whose
-- settlement commits in the same transaction as its reservation is never in flight as
-- far as Postgres can see — the usage row, written in that transaction, is its record.
--
-- So tg_settle_batch now writes no reservation row for a request that
--   * has none yet,
--   * was reserved the normal way (a `reserve` element with no note and state
--     `reserved`: not an `unheld` attempt, not an orphaned hold the reconciler recorded),
--   * made one attempt, and
--   * is settled (its usage row inserted) by this same batch.
-- Everything else keeps its rows exactly as before: a request still running when its
-- reservation's batch commits (a stream; any request under light load, whose
-- reservation goes out about a millisecond after its admission) gets its `reserved` row,
-- later marked `reconciled`; retries keep one row per attempt with its bound; usage
-- unknown, unheld attempts and orphaned holds keep theirs. The guarantees that rest on
-- rows therefore hold unchanged: every reservation of a request that is not settled is
-- in Postgres once its batch commits, as before. What changes: a settled request may have
-- no reservation row (`ledger verify` never required one: its check is that those present
-- are reconciled), and `reservations` no longer lists every request.

-- What it reserved stays known: such a request's usage row keeps its bound in the new
-- column `usage.reserved` (NULL for the others, whose reservation rows hold it).
ALTER TABLE usage ADD COLUMN reserved numeric(24, 10);

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
    -- inserted in request id order; a request id already there inserts nothing. A
    -- request with one attempt whose reservation is in this batch keeps its bound in
    -- the row (`reserved`: it may get no reservation row, step 3).
    WITH s AS (
        SELECT DISTINCT ON (e.request_id) e.* FROM unnest(els) e WHERE e.op IS NULL ORDER BY e.request_id, e.ord),
    rv AS (
        SELECT DISTINCT ON (e.request_id) e.request_id AS rid, e.amount FROM unnest(els) e
        WHERE e.op = 'reserve' AND e.attempt = 1 AND e.note IS NULL
          AND e.state IS DISTINCT FROM 'pending_reconciliation'
        ORDER BY e.request_id, e.ord),
    ins AS (
        INSERT INTO usage AS u (request_id, tenant_id, api_key_id, group_id, account_id, model, attempts,
                                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                                reasoning_tokens, cost, estimated, status, ttft_ms, total_ms, attempt_ids,
                                fingerprint, ledger_id, started_at, reserved)
        SELECT s.request_id, s.tenant_id, s.api_key_id, s.group_id, s.account_id, s.model, s.attempts, s.input,
               s.output, s.cache_read, s.cache_write, s.reasoning, s.cost, s.estimated, s.status, s.ttft_ms,
               s.total_ms, s.attempt_ids, s.fingerprint, lids[array_position(ltenants, s.tenant_id)],
               tg_request_started(s.request_id), CASE WHEN s.attempts = 1 THEN rv.amount END
        FROM s LEFT JOIN rv ON rv.rid = s.request_id
        WHERE NOT dropped OR NOT tg_usage_dropped(tg_request_started(s.request_id))
        ORDER BY s.request_id
        ON CONFLICT (request_id, started_at) DO NOTHING
        RETURNING u.request_id)
    SELECT coalesce(array_agg(s ORDER BY s.request_id), '{}') INTO won
    FROM s JOIN ins ON ins.request_id = s.request_id;

    -- 3. Reservation rows (0006), but none for a request that needs none: one attempt,
    -- reserved the normal way (no note, not written by the reconciler) and settled in
    -- this same transaction — its usage row is all Postgres needs of it (see above). A
    -- row that is already there (its reservation committed before, in a batch whose
    -- answer was lost and which the spool replays with the settlement) is reconciled as
    -- before.
    WITH r AS (
        SELECT DISTINCT ON (e.request_id, e.attempt)
               e.request_id AS rid, e.attempt, e.tenant_id, e.api_key_id, e.amount, e.model, e.instance,
               CASE WHEN e.state = 'pending_reconciliation' THEN 'pending_reconciliation' ELSE 'reserved' END AS state,
               e.note, coalesce(to_timestamp(e.created_ms / 1000), now()) AS created_at
        FROM unnest(els) e WHERE e.op = 'reserve'
        ORDER BY e.request_id, e.attempt, e.ord),
    s AS (
        SELECT w.request_id AS rid, g AS attempt, w.tenant_id, w.api_key_id, w.cost, w.attempts
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
    WHERE NOT (r.rid IS NOT NULL AND s.rid IS NOT NULL AND s.attempts = 1 AND r.state = 'reserved'
               AND r.note IS NULL
               AND NOT EXISTS (SELECT 1 FROM reservations x WHERE x.request_id = r.rid AND x.attempt = r.attempt))
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
