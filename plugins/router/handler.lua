-- router: picks the upstream account. Each candidate gets a score from its priority,
-- load, queue, error and TTFT EWMAs, the time until its rate window resets, its cost
-- and stickiness; then one of the best top_k is drawn at random, weighted by
-- exp((score - best) / temperature), so load spreads without flapping to the worst.
-- Excluded accounts (by a policy of higher priority) are never scored.
local M = { name = "router", priority = 500, version = "1.0.0" }

local exp, random = math.exp, math.random

function M._score(a, conf)
    local w = conf.weights
    local load
    local saturated = false
    if a.max_concurrency > 0 then
        load = a.inflight / a.max_concurrency
        saturated = a.inflight >= a.max_concurrency
    else
        load = a.inflight / 100
    end
    local s = w.priority * a.priority - w.load * load - w.queue * a.queued
        - w.error * a.error_ewma - w.cost * a.cost - w.tried * a.tried
    if a.ttft_ewma_ms >= 0 then s = s - w.ttft * a.ttft_ewma_ms / 1000 end
    if a.reset_in_ms >= 0 and a.reset_in_ms < conf.reset_window_ms then
        s = s + w.reset * (1 - a.reset_in_ms / conf.reset_window_ms)
    end
    -- Stickiness keeps prompt-cache locality, but is dropped at once for an account
    -- that is saturated, failing or slow.
    if a.sticky and not saturated and a.error_ewma <= conf.sticky_max_error
            and (a.ttft_ewma_ms < 0 or a.ttft_ewma_ms <= conf.sticky_max_ttft_ms) then
        s = s + w.sticky
    end
    if saturated then s = s - conf.saturated_penalty end
    return s
end

-- Scratch arrays reused across calls (one lua_State per worker, one call at a time).
local idx, scores = {}, {}

function M.select_account(ctx, conf)
    local n, k = ctx:naccounts(), 0
    for i = 1, n do
        local a = ctx:account(i)
        if not a.excluded then
            local s = M._score(a, conf)
            ctx:set_score(i, s)
            -- Insertion into the descending top list, at most top_k long.
            local pos = k + 1
            while pos > 1 and scores[pos - 1] < s do pos = pos - 1 end
            if pos <= conf.top_k then
                local last = k < conf.top_k and k + 1 or k
                for j = last, pos + 1, -1 do
                    idx[j], scores[j] = idx[j - 1], scores[j - 1]
                end
                idx[pos], scores[pos] = i, s
                k = last
            end
        end
    end
    if k == 0 then return end
    local best, total = scores[1], 0
    for j = 1, k do
        local wj = exp((scores[j] - best) / conf.temperature)
        scores[j] = wj
        total = total + wj
    end
    local r, pick = random() * total, idx[k]
    for j = 1, k do
        r = r - scores[j]
        if r <= 0 then pick = idx[j] break end
    end
    ctx:select(pick)
end

return M
