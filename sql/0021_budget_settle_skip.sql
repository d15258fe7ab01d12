-- pipeline (#17, goal 3): a settlement batch that counts in no periodic budget skips the
-- budgets' statement.
--
-- tg_settle_batch (0017) calls tg_budget_settle(batch, won) for every batch. 0008's
-- function is LANGUAGE sql with data-modifying CTEs, so Postgres cannot inline it and
-- plans its one statement (four CTEs, a join to budgets) on every call, whatever the
-- batch holds: about 5% of a batch's CPU (spec/bench/RESULTS.md, "Where issue 17 stands
-- after session 9"), even though most keys have no periodic budget. A settlement counts
-- in a budget's period only when the gateway wrote its "budgets" member
-- (tg_billing_settle.c, when the request counted in one or more), so a batch without any
-- such member has nothing for that statement to insert or update. Now 0008's function,
-- renamed tg_budget_settle_periods and unchanged, runs only when some element of the
-- batch has that member (one jsonpath test over the batch); tg_settle_batch is
-- unchanged and calls tg_budget_settle as before.
ALTER FUNCTION tg_budget_settle(jsonb, tg_settle_element[]) RENAME TO tg_budget_settle_periods;

CREATE FUNCTION tg_budget_settle(batch jsonb, won tg_settle_element[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF cardinality(won) > 0 AND jsonb_path_exists(batch, '$[*].budgets') THEN
        PERFORM tg_budget_settle_periods(batch, won);
    END IF;
END $$;
