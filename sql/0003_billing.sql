-- Two-phase metering. A request reserves the upper bound of its cost before the
-- upstream call (one `reservations` row per attempt); afterwards tg_settle() bills the
-- exact usage once: the billing_dedup insert decides whether anything else happens, so
-- replaying a settlement (retries, the local spool, the reconciler) never bills twice.

ALTER TABLE reservations
    ADD COLUMN model text,
    ADD COLUMN settled_cost numeric(24, 10),
    ADD COLUMN note text;

ALTER TABLE usage
    ADD COLUMN attempt_ids jsonb NOT NULL DEFAULT '[]';

-- Settles a batch of requests (a JSON array of objects) in one transaction. Returns
-- one row per element: request_id and 'settled', 'duplicate' or 'conflict' (the same
-- request id settled before with a different fingerprint: logged loudly by the caller,
-- never billed twice).
CREATE FUNCTION tg_settle_batch(batch jsonb)
RETURNS TABLE (request_id text, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    s jsonb;
    fp text;
    c numeric;
BEGIN
    FOR s IN SELECT * FROM jsonb_array_elements(batch) LOOP
        request_id := s->>'request_id';
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
