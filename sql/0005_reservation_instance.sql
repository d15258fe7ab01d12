-- Which gateway instance holds a reservation: the reconciler leaves the reservations
-- of live instances alone (a long stream is not "lost" because it is long) and settles
-- those of instances that stopped heart-beating (crashed) once reconcile_after passed.
-- tg_settle_batch also locks the batch's tenants and keys in id order first, so batches
-- of the same tenants in different orders never deadlock.
ALTER TABLE reservations ADD COLUMN instance text;

CREATE OR REPLACE FUNCTION tg_settle_batch(batch jsonb)
RETURNS TABLE (request_id text, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    s jsonb;
    fp text;
    c numeric;
BEGIN
    PERFORM 1 FROM tenants WHERE id IN (SELECT DISTINCT (e->>'tenant_id')::bigint
        FROM jsonb_array_elements(batch) e WHERE e->>'op' IS NULL) ORDER BY id FOR UPDATE;
    PERFORM 1 FROM api_keys WHERE id IN (SELECT DISTINCT (e->>'api_key_id')::bigint
        FROM jsonb_array_elements(batch) e WHERE e->>'op' IS NULL) ORDER BY id FOR UPDATE;
    FOR s IN SELECT * FROM jsonb_array_elements(batch) LOOP
        request_id := s->>'request_id';
        IF s->>'op' = 'reserve' THEN
            INSERT INTO reservations (request_id, attempt, tenant_id, api_key_id, amount, model, state, instance)
            VALUES (s->>'request_id', (s->>'attempt')::int, (s->>'tenant_id')::bigint,
                    (s->>'api_key_id')::bigint, (s->>'amount')::numeric, s->>'model',
                    CASE WHEN EXISTS (SELECT 1 FROM billing_dedup d WHERE d.request_id = s->>'request_id')
                         THEN 'reconciled' ELSE 'reserved' END, s->>'instance')
            ON CONFLICT DO NOTHING;
            outcome := 'reserved';
            RETURN NEXT;
            CONTINUE;
        END IF;
        INSERT INTO billing_dedup (request_id, api_key_id, fingerprint)
        VALUES (s->>'request_id', (s->>'api_key_id')::bigint, s->>'fingerprint')
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            SELECT d.fingerprint INTO fp FROM billing_dedup d WHERE d.request_id = s->>'request_id';
            outcome := CASE WHEN fp = s->>'fingerprint' THEN 'duplicate' ELSE 'conflict' END;
            RETURN NEXT;
            CONTINUE;
        END IF;
        c := (s->>'cost')::numeric;
        UPDATE tenants SET balance = balance - c, spend = spend + c, updated_at = now()
            WHERE id = (s->>'tenant_id')::bigint;
        UPDATE api_keys SET spend = spend + c WHERE id = (s->>'api_key_id')::bigint;
        INSERT INTO usage (request_id, tenant_id, api_key_id, group_id, account_id, model, attempts,
                           input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                           reasoning_tokens, cost, estimated, status, ttft_ms, total_ms, attempt_ids)
        VALUES (s->>'request_id', (s->>'tenant_id')::bigint, (s->>'api_key_id')::bigint,
                (s->>'group_id')::bigint, (s->>'account_id')::bigint, s->>'model',
                coalesce((s->>'attempts')::int, 1),
                (s->>'input')::bigint, (s->>'output')::bigint, (s->>'cache_read')::bigint,
                (s->>'cache_write')::bigint, (s->>'reasoning')::bigint, c,
                coalesce((s->>'estimated')::boolean, false), (s->>'status')::int,
                (s->>'ttft_ms')::double precision, (s->>'total_ms')::double precision,
                coalesce(s->'attempt_ids', '[]'));
        INSERT INTO ledger (tenant_id, kind, amount, request_id)
        VALUES ((s->>'tenant_id')::bigint, 'usage', -c, s->>'request_id');
        UPDATE reservations r SET state = 'reconciled', settled_cost = c, updated_at = now()
            WHERE r.request_id = s->>'request_id' AND r.state IN ('reserved', 'pending_reconciliation');
        outcome := 'settled';
        RETURN NEXT;
    END LOOP;
END $$;
