-- pipeline (#17, goal 3): a settlement batch with fewer statements, fewer elements and no
-- per-row foreign key checks — Postgres CPU per billed request.
--
-- Three changes, each measured in spec/bench/RESULTS.md ("Session 14"):
--
-- 1. A request whose reservation and settlement go to Postgres in the same batch is one
--    element, not two. The gateway (tg_billing_settle.c, when it sends a live batch)
--    writes such a pair — a `reserve` of attempt 1 made the normal way (held in Redis,
--    no note) and a settlement of one attempt — as the settlement alone, carrying the
--    reservation's bound and instance (`amount`, `instance`: members a settlement never
--    had). Under load that is nearly every request: half the elements to decode, and
--    the reservation statement (step 3), which for such a request wrote nothing since
--    0017, no longer runs for a batch that has no other kind of element. A merged
--    element that does not bill (a duplicate, a conflict, an expired partition) writes
--    the reservation row its `reserve` element would have written. Elements of both
--    forms may meet in one batch; nothing else about an element changes, so spools
--    written before this migration replay as they are.
--
-- 2. usage's two foreign keys (to tenants and to api_keys) are checked once per batch
--    instead of once per row. Each inserted row queued an AFTER trigger that ran a
--    `SELECT … FOR KEY SHARE` on tenants and another on api_keys through SPI (14% of a
--    batch's CPU, session 10). tg_settle_batch now takes those same locks itself, once
--    for the batch's distinct tenants and keys, before inserting the usage rows, and
--    refuses the batch (SQLSTATE 23503, foreign_key_violation, as the constraint did:
--    the gateway splits the batch and quarantines the element) when a tenant or key is
--    not there. KEY SHARE, as the checks took: batches of one tenant still run side by
--    side and meet only on its balance update at the end (FOR NO KEY UPDATE, in id
--    order, as before). Only tg_settle_batch inserts usage rows. The other half of a
--    foreign key — a tenant or key cannot be deleted while usage refers to it — is a
--    BEFORE DELETE trigger on each table (raising 23503 too, which the admin API already
--    answers with 409 in_use). The two sides meet on the row lock, as they did: a delete
--    waits for a batch holding the row and then sees its usage rows (each statement of a
--    READ COMMITTED trigger takes a new snapshot); a batch waiting for a row being
--    deleted finds it gone and is refused.
--
-- 3. The statements that have nothing to do are not run: the reservation rows (step 3)
--    unless a batch has a `reserve` element, a settlement that did not bill, or a billed
--    settlement without its reservation merged in; usage unknown (step 4) unless a batch
--    has an `unknown` element; and the outcomes of a batch whose every element is a
--    settlement that billed are all `settled`, without the join. The billed settlements
--    are collected as the element type itself (they went through a record → text →
--    record conversion per element when assigned).

-- The parent's two (named usage_tenant_id_fkey1 and usage_api_key_id_fkey1: 0009 made
-- them while usage_legacy held the plain names), which takes its partitions' with them,
-- then any a partition has of its own.
DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT con.conname, con.conrelid::regclass AS rel FROM pg_constraint con
             WHERE con.contype = 'f' AND con.conparentid = 0
               AND con.confrelid IN ('tenants'::regclass, 'api_keys'::regclass)
               AND (con.conrelid = 'usage'::regclass
                    OR con.conrelid IN (SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = 'usage'::regclass))
             ORDER BY con.conrelid = 'usage'::regclass DESC LOOP
        IF EXISTS (SELECT 1 FROM pg_constraint x WHERE x.conrelid = c.rel AND x.conname = c.conname) THEN
            EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', c.rel, c.conname);
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_constraint con WHERE con.contype = 'f'
               AND con.confrelid IN ('tenants'::regclass, 'api_keys'::regclass)
               AND (con.conrelid = 'usage'::regclass
                    OR con.conrelid IN (SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = 'usage'::regclass))) THEN
        RAISE EXCEPTION '0023: a foreign key of usage to tenants or api_keys is left';
    END IF;
END $$;

-- The delete side of the foreign keys: a tenant or key with usage rows stays.
CREATE FUNCTION tg_usage_referenced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (TG_TABLE_NAME = 'tenants' AND EXISTS (SELECT 1 FROM usage u WHERE u.tenant_id = OLD.id))
       OR (TG_TABLE_NAME = 'api_keys' AND EXISTS (SELECT 1 FROM usage u WHERE u.api_key_id = OLD.id)) THEN
        RAISE foreign_key_violation USING
            MESSAGE = format('%s %s is still referenced from table "usage"', TG_TABLE_NAME, OLD.id),
            TABLE = 'usage';
    END IF;
    RETURN OLD;
END $$;
CREATE TRIGGER tenants_usage_referenced BEFORE DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION tg_usage_referenced();
CREATE TRIGGER api_keys_usage_referenced BEFORE DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION tg_usage_referenced();

-- The batch is json now, not jsonb: json_to_recordset reads the gateway's text once,
-- where jsonb_in built a tree of it first (sorted, deduplicated keys) for
-- jsonb_to_recordset to read — 6% of a batch of 200 requests, 17% of one of 400 (the
-- parse copies grow with the text). The jsonb form, which every caller before this
-- migration uses (the reconciler's and `ledger`'s, the tests'), calls this one.
CREATE FUNCTION tg_settle_batch(batch json)
RETURNS TABLE (request_id text, outcome text) LANGUAGE plpgsql
-- The planner cannot know a batch's size; JIT-compiling a plan for 200 rows costs ~1 s.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    els tg_settle_element[];
    won tg_settle_element[]; -- the settlements that bill: the first of each request id that inserted
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
    WITH s AS (
        SELECT DISTINCT ON (e.request_id) e.*, e AS el FROM unnest(els) e WHERE e.op IS NULL
        ORDER BY e.request_id, e.ord),
    rv AS (
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
        FROM s LEFT JOIN rv ON rv.rid = s.request_id
        WHERE NOT dropped OR NOT tg_usage_dropped(tg_request_started(s.request_id))
        ORDER BY s.request_id
        ON CONFLICT (request_id, started_at) DO NOTHING
        RETURNING u.request_id)
    SELECT coalesce(array_agg(s.el ORDER BY s.request_id), '{}') INTO won
    FROM s JOIN ins ON ins.request_id = s.request_id;

    -- 3. Reservation rows (0006, 0017), when there is one to write or to reconcile: a
    -- `reserve` element, a settlement that did not bill (its merged reservation is
    -- written as its `reserve` element would have been), or a billed settlement whose
    -- reservation is not merged into it (reconciled, or written `awaiting reservation`).
    -- None for a request that needs none: one attempt, reserved the normal way and
    -- settled in this same transaction.
    IF nres > 0 OR cardinality(won) < nset
       OR EXISTS (SELECT 1 FROM unnest(won) w WHERE w.amount IS NULL OR w.attempts <> 1) THEN
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
                    AND e.ord NOT IN (SELECT w.ord FROM unnest(won) w)) e
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
        PERFORM 1 FROM tenants WHERE id IN (SELECT w.tenant_id FROM unnest(won) w) ORDER BY id FOR NO KEY UPDATE;
        WITH a AS (SELECT w.tenant_id, sum(w.cost) AS c, count(*) AS n FROM unnest(won) w GROUP BY w.tenant_id),
        l AS (
            INSERT INTO ledger (id, tenant_id, kind, amount, note)
            SELECT lids[array_position(ltenants, a.tenant_id)], a.tenant_id, 'usage', -a.c,
                   a.n || ' request(s), see usage.ledger_id'
            FROM a ORDER BY a.tenant_id)
        UPDATE tenants t SET balance = t.balance - a.c, spend = t.spend + a.c, updated_at = now()
        FROM a WHERE t.id = a.tenant_id;
        PERFORM 1 FROM api_keys WHERE id IN (SELECT w.api_key_id FROM unnest(won) w) ORDER BY id FOR NO KEY UPDATE;
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

CREATE OR REPLACE FUNCTION tg_settle_batch(batch jsonb)
RETURNS TABLE (request_id text, outcome text) LANGUAGE sql AS $$
    SELECT * FROM tg_settle_batch(batch::json)
$$;

-- tg_request_started (0009, 0018) without a regular expression, and with a float
-- division: called three times for each usage row (its value, the partitions' CHECK,
-- the rollup's hour), its regex was ~3% of a batch. Same answer for every text, so the
-- CHECK holds for every existing row: 31 bytes whose 13th character is '-' and whose 12
-- before and 18 after are hex digits is what '^[0-9a-f]+-[0-9a-f]+$' accepted of such a
-- text; and the milliseconds, exact in a float8 (below 2^53), divided by 1000 in float8
-- give the double nearest the exact quotient, which is what the exact numeric quotient
-- converted to float8 gave.
CREATE OR REPLACE FUNCTION tg_request_started(rid text) RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(rid) = 31 AND substr(rid, 13, 1) = '-'
                     AND ltrim(left(rid, 12), '0123456789abcdef') = '' AND ltrim(right(rid, 18), '0123456789abcdef') = ''
                THEN to_timestamp(('x' || lpad(left(rid, 12), 16, '0'))::bit(64)::bigint::float8 / 1000)
                ELSE '-infinity'::timestamptz END
$$;
