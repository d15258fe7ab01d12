-- router: picks the upstream account. Each candidate gets a score from its priority,
-- load, queue, error and TTFT EWMAs, the time until its rate window resets, the share
-- of its quota left (headroom) and a plan window about to reset with quota unused (use
-- it or lose it) — both as its provider last said —, its cost and stickiness; then one of the best top_k is drawn at random, weighted by
-- exp((score - best) / temperature), so load spreads without flapping to the worst.
-- Excluded accounts (by a policy of higher priority) are never scored.
--
-- A plugin's loops run interpreted (plugins/README.md, Isolation), so the loop over the
-- accounts is ctx:score_accounts's, which calls `score` (no loop: it runs compiled)
-- for each and keeps the top_k; the weights live in upvalues (reloaded only when the
-- config changes), each account field is read once.
local M = { name = "router", priority = 500, version = "1.0.0" }

local exp, random = math.exp, math.random

-- conf's weights and limits as upvalues (cheaper than table lookups), loaded when the
-- config in use changes (a group may have its own instance).
local cur_conf
local wpri, wload, wqueue, werr, wttft, wreset, wcost, wsticky, wtried, whead, wuse
local window, use_window, sticky_max_error, sticky_max_ttft, saturated_penalty

local function use(conf)
    if conf == cur_conf then return end
    local w = conf.weights
    wpri, wload, wqueue, werr, wttft = w.priority, w.load, w.queue, w.error, w.ttft
    wreset, wcost, wsticky, wtried = w.reset, w.cost, w.sticky, w.tried
    whead, wuse = w.headroom, w.use_it_or_lose_it
    window, sticky_max_error = conf.reset_window_ms, conf.sticky_max_error
    use_window = conf.use_it_window_ms
    sticky_max_ttft, saturated_penalty = conf.sticky_max_ttft_ms, conf.saturated_penalty
    cur_conf = conf
end

-- The score of account `a` (as ctx:account returns it) under the conf in use.
local function score(a)
    local inflight, maxc = a.inflight, a.max_concurrency
    local error_ewma, ttft, reset = a.error_ewma, a.ttft_ewma_ms, a.reset_in_ms
    local load
    local saturated = false
    if maxc > 0 then
        load = inflight / maxc
        saturated = inflight >= maxc
    else
        load = inflight / 100
    end
    local s = wpri * a.priority - wload * load - wqueue * a.queued
        - werr * error_ewma - wcost * a.cost - wtried * a.tried
    if ttft >= 0 then s = s - wttft * ttft / 1000 end
    if reset >= 0 and reset < window then
        s = s + wreset * (1 - reset / window)
    end
    -- The provider's own figures: little quota left weighs against an account; a plan
    -- window that resets soon with quota unused weighs for it (what is not used by the
    -- reset is lost).
    local headroom, left, wreset_in = a.headroom, a.window_left, a.window_reset_in_ms
    if headroom >= 0 then s = s - whead * (1 - headroom) end
    if left > 0 and wreset_in >= 0 and wreset_in < use_window then
        s = s + wuse * left * (1 - wreset_in / use_window)
    end
    -- Stickiness keeps prompt-cache locality, but is dropped at once for an account
    -- that is saturated, failing or slow.
    if a.sticky and not saturated and error_ewma <= sticky_max_error
            and (ttft < 0 or ttft <= sticky_max_ttft) then
        s = s + wsticky
    end
    if saturated then s = s - saturated_penalty end
    return s
end

function M._score(a, conf)
    use(conf)
    return score(a)
end

function M.select_account(ctx, conf)
    use(conf)
    -- Scored and ranked by the runtime's loop, where `score` (no loop) runs compiled.
    local k, idx, scores = ctx:score_accounts(score, nil, conf.top_k)
    if k == 0 then return end
    local best, total, temperature = scores[1], 0, conf.temperature
    for j = 1, k do
        local wj = exp((scores[j] - best) / temperature)
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
