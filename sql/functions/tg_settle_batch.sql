-- tg_settle_batch(json): one settlement batch of the gateway (core/src/domain/tg_billing_settle.c),
-- in one transaction. This file is sql/functions/: kept whole and edited in place, applied
-- again by `tollgate migrate` whenever it changes (its SHA-256 in schema_functions), after
-- the numbered migrations. Its history: 0006 (the batch), 0009 (partitions), 0017 (one row a
-- request), 0021 (budgets), 0023 (the merged element, foreign keys once a batch; the
-- reasoning of each step is there), then here. The jsonb form (0023) calls this one.
--
-- Since 0023: the billed settlements are known without a join. The first settlement of each
-- request id (`sel`) is collected once; when every one of them inserted (the normal path),
-- `won` is `sel` itself. 0023 joined the inserted request ids back to the settlements, and
-- with no row estimate for an array the planner joined them in a nested loop: n x n text
-- comparisons, 40,000 for a batch of 200 — a quarter of the batch's CPU, and four times that
-- for a batch of 400 (spec/bench/RESULTS.md, session 15). Outcomes and the reservation step
-- read the winners' positions (`wonords`) the same way, and a loser's fingerprint from its
-- request's usage row, which the winner of the same batch has just written.
CREATE OR REPLACE FUNCTION tg_settle_batch(batch json)
RETURNS TABLE (request_id text, outcome text) LANGUAGE plpgsql
-- The planner cannot know a batch's size; JIT-compiling a plan for 200 rows costs ~1 s.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    els tg_settle_element[];
    sel tg_settle_element[]; -- the first settlement of each request id, in request id order
    won tg_settle_element[]; -- the settlements that bill: those of sel that inserted
    wonords bigint[];        -- their ords
    insids text[];           -- the request ids inserted
    lids bigint[];
    ltenants bigint[];       -- the distinct tenants of the batch's settlements, ascending
    lkeys bigint[];          -- and their keys
    nset int;                -- settlements
    nres int;                -- `reserve` elements
    nunknown int;            -- `unknown` elements
    nlocked int;
    dropped boolean;         -- a usage partition was ever dropped (then ranges are checked)
BEGIN
    els := ARRAY(
        SELECT ROW(x.ord, x.op, x.request_id, x.fingerprint, x.tenant_id, x.api_key_id, x.group_id, x.account_id,
                   x.model, greatest(coalesce(x.attempts, 1), 1), x.attempt, x.input, x.output, x.cache_read,
                   x.cache_write, x.reasoning, x.cost, x.amount, coalesce(x.estimated, false),
                   x.status, x.ttft_ms, x.total_ms, coalesce(x.attempt_ids, '[]'),
                   x.instance, x.state, x.note, x.created_ms)::tg_settle_element
        FROM ROWS FROM (json_to_recordset(batch) AS (op text, request_id text, fingerprint text, tenant_id bigint,
                        api_key_id bigint, group_id bigint, account_id bigint, model text, attempts int, attempt int,
                        input bigint, output bigint, cache_read bigint, cache_write bigint, reasoning bigint,
                        cost numeric, amount numeric, estimated boolean, status int,
                        ttft_ms double precision, total_ms double precision, attempt_ids jsonb,
                        instance text, state text, note text, created_ms double precision))
             WITH ORDINALITY AS x(op, request_id, fingerprint, tenant_id, api_key_id, group_id, account_id, model,
                                  attempts, attempt, input, output, cache_read, cache_write, reasoning, cost,
                                  amount, estimated, status, ttft_ms, total_ms, attempt_ids,
                                  instance, state, note, created_ms, ord));
    SELECT count(*) FILTER (WHERE e.op IS NULL), count(*) FILTER (WHERE e.op = 'reserve'),
           count(*) FILTER (WHERE e.op = 'unknown'),
           array_agg(DISTINCT e.tenant_id) FILTER (WHERE e.op IS NULL AND e.tenant_id IS NOT NULL),
           array_agg(DISTINCT e.api_key_id) FILTER (WHERE e.op IS NULL AND e.api_key_id IS NOT NULL)
    INTO nset, nres, nunknown, ltenants, lkeys
    FROM unnest(els) e;
    dropped := EXISTS (SELECT 1 FROM detail_partitions d WHERE d.parent = 'usage' AND d.dropped_at IS NOT NULL);

    IF nset > 0 THEN
        -- 1. The foreign keys of usage, once for the batch: its tenants and keys locked
        -- as the checks locked them (KEY SHARE: a delete waits, other batches do not)
        -- and all there. One ledger entry id per tenant.
        PERFORM 1 FROM tenants WHERE id = ANY (ltenants) ORDER BY id FOR KEY SHARE;
        GET DIAGNOSTICS nlocked = ROW_COUNT;
        IF nlocked <> cardinality(ltenants) THEN
            RAISE foreign_key_violation USING MESSAGE = 'a settlement names a tenant that does not exist',
                TABLE = 'usage', COLUMN = 'tenant_id';
        END IF;
        PERFORM 1 FROM api_keys WHERE id = ANY (lkeys) ORDER BY id FOR KEY SHARE;
        GET DIAGNOSTICS nlocked = ROW_COUNT;
        IF nlocked <> cardinality(lkeys) THEN
            RAISE foreign_key_violation USING MESSAGE = 'a settlement names an API key that does not exist',
                TABLE = 'usage', COLUMN = 'api_key_id';
        END IF;
        lids := ARRAY(SELECT nextval('ledger_id_seq') FROM generate_series(1, cardinality(ltenants)));
    END IF;

    -- 2. The usage rows, which are the dedup: the first settlement of each request id,
    -- inserted in request id order; a request id already there inserts nothing. A
    -- request with one attempt whose reservation is in this batch — merged into its
    -- settlement (`amount`) or as a `reserve` element — keeps its bound in the row.
    sel := ARRAY(SELECT DISTINCT ON (e.request_id) e FROM unnest(els) e WHERE e.op IS NULL
                 ORDER BY e.request_id, e.ord);
    WITH rv AS (
        SELECT DISTINCT ON (e.request_id) e.request_id AS rid, e.amount FROM unnest(els) e
        WHERE nres > 0 AND e.op = 'reserve' AND e.attempt = 1 AND e.note IS NULL
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
               tg_request_started(s.request_id), CASE WHEN s.attempts = 1 THEN coalesce(s.amount, rv.amount) END
        FROM unnest(sel) s LEFT JOIN rv ON rv.rid = s.request_id
        WHERE NOT dropped OR NOT tg_usage_dropped(tg_request_started(s.request_id))
        ORDER BY s.request_id
        ON CONFLICT (request_id, started_at) DO NOTHING
        RETURNING u.request_id)
    SELECT coalesce(array_agg(ins.request_id), '{}') INTO insids FROM ins;
    IF cardinality(insids) = cardinality(sel) THEN
        won := sel;
    ELSE
        won := ARRAY(SELECT s FROM unnest(sel) s WHERE s.request_id = ANY (insids) ORDER BY s.request_id);
    END IF;

    -- 3. Reservation rows (0006, 0017), when there is one to write or to reconcile: a
    -- `reserve` element, a settlement that did not bill (its merged reservation is
    -- written as its `reserve` element would have been), or a billed settlement whose
    -- reservation is not merged into it (reconciled, or written `awaiting reservation`).
    -- None for a request that needs none: one attempt, reserved the normal way and
    -- settled in this same transaction.
    IF nres > 0 OR cardinality(won) < nset
       OR EXISTS (SELECT 1 FROM unnest(won) w WHERE w.amount IS NULL OR w.attempts <> 1) THEN
        wonords := ARRAY(SELECT w.ord FROM unnest(won) w);
        WITH r AS (
            SELECT DISTINCT ON (e.request_id, e.attempt)
                   e.request_id AS rid, e.attempt, e.tenant_id, e.api_key_id, e.amount, e.model, e.instance,
                   CASE WHEN e.state = 'pending_reconciliation' THEN 'pending_reconciliation' ELSE 'reserved' END
                       AS state,
                   e.note, coalesce(to_timestamp(e.created_ms / 1000), now()) AS created_at
            FROM (SELECT e.ord, e.request_id, e.attempt, e.tenant_id, e.api_key_id, e.amount, e.model, e.instance,
                         e.state, e.note, e.created_ms
                  FROM unnest(els) e WHERE e.op = 'reserve'
                  UNION ALL
                  -- a merged reservation whose settlement did not bill
                  SELECT e.ord, e.request_id, 1, e.tenant_id, e.api_key_id, e.amount, e.model, e.instance,
                         NULL, NULL, NULL
                  FROM unnest(els) e
                  WHERE e.op IS NULL AND e.amount IS NOT NULL AND e.attempts = 1
                    AND NOT (e.ord = ANY (wonords))) e
            ORDER BY e.request_id, e.attempt, e.ord),
        s AS (
            SELECT w.request_id AS rid, g AS attempt, w.tenant_id, w.api_key_id, w.cost, w.attempts
            FROM unnest(won) w, generate_series(1, w.attempts) g
            WHERE w.amount IS NULL OR w.attempts <> 1)
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
    END IF;
    -- A billed settlement with its reservation merged has no row of its own; one written
    -- meanwhile by someone else (the reconciler's record of an orphaned hold, for a
    -- gateway it took for dead) is reconciled, as step 3 did before such elements.
    IF nset > 0 THEN
        UPDATE reservations x SET state = 'reconciled', settled_cost = w.cost, updated_at = now()
        FROM unnest(won) w
        WHERE w.amount IS NOT NULL AND w.attempts = 1 AND x.request_id = w.request_id AND x.attempt = 1
          AND x.state IN ('reserved', 'pending_reconciliation');
    END IF;

    -- 4. Usage unknown (0004), as in 0006.
    IF nunknown > 0 THEN
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
    END IF;

    IF cardinality(won) > 0 THEN
        -- 5 and 6. The ledger: one entry per tenant, minus the sum of its billed costs;
        -- balances and spend: one row update per tenant and per key, locked in id order.
        -- Locked: the batch's settlements' tenants and keys (step 1's arrays), a superset
        -- of the winners' when a settlement did not bill (a lock it did not need, held
        -- to commit), the same set otherwise — without a pass over `won` to find them
        -- (6% of a batch, session 15).
        PERFORM 1 FROM tenants WHERE id = ANY (ltenants) ORDER BY id FOR NO KEY UPDATE;
        WITH a AS (SELECT w.tenant_id, sum(w.cost) AS c, count(*) AS n FROM unnest(won) w GROUP BY w.tenant_id),
        l AS (
            INSERT INTO ledger (id, tenant_id, kind, amount, note)
            SELECT lids[array_position(ltenants, a.tenant_id)], a.tenant_id, 'usage', -a.c,
                   a.n || ' request(s), see usage.ledger_id'
            FROM a ORDER BY a.tenant_id)
        UPDATE tenants t SET balance = t.balance - a.c, spend = t.spend + a.c, updated_at = now()
        FROM a WHERE t.id = a.tenant_id;
        PERFORM 1 FROM api_keys WHERE id = ANY (lkeys) ORDER BY id FOR NO KEY UPDATE;
        UPDATE api_keys k SET spend = k.spend + a.c
        FROM (SELECT w.api_key_id, sum(w.cost) AS c FROM unnest(won) w GROUP BY w.api_key_id) a
        WHERE k.id = a.api_key_id;

        -- 6b. Periodic budgets (0008_budgets.sql, 0021): only when a settlement counts
        -- in one (its "budgets" member; a false match — a model named so — costs only the
        -- jsonb test of 0021).
        IF strpos(batch::text, '"budgets"') > 0 THEN
            PERFORM tg_budget_settle(batch::jsonb, won);
        END IF;
        -- 6c. The hourly rollups (0010_rollups.sql, 0020, 0022): one aggregated upsert for the batch.
        PERFORM tg_usage_rollup(won);
    END IF;

    -- 7. One outcome per element, in order.
    IF nres = 0 AND nunknown = 0 AND cardinality(won) = nset AND nset = cardinality(els) THEN
        -- every element a settlement that billed
        RETURN QUERY SELECT e.request_id, 'settled'::text FROM unnest(els) e ORDER BY e.ord;
        RETURN;
    END IF;
    IF wonords IS NULL THEN
        wonords := ARRAY(SELECT w.ord FROM unnest(won) w);
    END IF;
    RETURN QUERY
    SELECT e.request_id,
           CASE WHEN e.op = 'reserve' THEN 'reserved'
                WHEN e.op = 'unknown' THEN 'unknown'
                WHEN e.ord = ANY (wonords) THEN 'settled'
                -- (no winner of this id: step 2 inserts none whose partition is dropped)
                WHEN dropped AND tg_usage_dropped(tg_request_started(e.request_id)) THEN 'expired'
                WHEN (SELECT u.fingerprint FROM usage u WHERE u.request_id = e.request_id
                      AND u.started_at = tg_request_started(e.request_id)) IS NOT DISTINCT FROM e.fingerprint
                     THEN 'duplicate'
                ELSE 'conflict' END
    FROM unnest(els) e
    ORDER BY e.ord;
END $$;
