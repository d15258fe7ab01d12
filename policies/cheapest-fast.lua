-- cheapest-fast: send each request to the cheapest account that is fast enough.
--
-- Among the accounts not excluded, not saturated and not failing, whose TTFT EWMA is
-- known and at most ttft_floor_ms, pick the cheapest (ties: the least loaded). If no
-- account qualifies, decide nothing and let the router (lower priority) choose.
-- Example config:
--   { name = "cheapest-fast", config = { ttft_floor_ms = 1500, max_error = 0.1 } }
local P = {
    name = "cheapest-fast", priority = 600, version = "1.0.0",
    schema = {
        fields = {
            ttft_floor_ms = { type = "number", default = 2000, between = { 1, 600000 } },
            max_error = { type = "number", default = 0.2, between = { 0, 1 } },
        },
    },
}

function P.select_account(ctx, conf)
    local best, best_cost, best_load
    for i = 1, ctx:naccounts() do
        local a = ctx:account(i)
        local saturated = a.max_concurrency > 0 and a.inflight >= a.max_concurrency
        if not a.excluded and not saturated and a.error_ewma <= conf.max_error
                and a.ttft_ewma_ms >= 0 and a.ttft_ewma_ms <= conf.ttft_floor_ms then
            local load = a.inflight
            if not best or a.cost < best_cost or (a.cost == best_cost and load < best_load) then
                best, best_cost, best_load = i, a.cost, load
            end
        end
    end
    if best then
        ctx:log_field("policy", "cheapest-fast")
        ctx:select(best)
    end
end

return P
