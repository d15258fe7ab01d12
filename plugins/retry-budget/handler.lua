-- retry-budget: the one place that decides retries (on_upstream_error).
--
-- Never after a byte reached the client. Otherwise, within max_attempts and the
-- deadline: transient statuses (500/502/503/504) retry once on the same account, then
-- elsewhere; account-level statuses (401/403/429/529) and connection failures go to
-- another account at once. The delay is exponential backoff with full jitter, at least
-- the upstream's Retry-After when staying on the same account; a Retry-After longer
-- than max_retry_after_ms moves to another account instead of waiting. Anything else
-- (400, 404, 422, ...) gives up: the same request would fail the same way.
local M = { name = "retry-budget", priority = 500, version = "1.0.0" }

local floor, min, random = math.floor, math.min, math.random

function M.init(conf)
    conf._same, conf._other = {}, {}
    for _, s in ipairs(conf.same_account) do conf._same[s] = true end
    for _, s in ipairs(conf.other_account) do conf._other[s] = true end
end

-- Returns action ("same", "other" or "give_up"), delay_ms, reason.
function M._decide(ctx, conf)
    if ctx:bytes_sent() then return "give_up", 0, "bytes_sent" end
    local attempt = ctx:attempt()
    if attempt >= conf.max_attempts then return "give_up", 0, "attempts" end

    local action
    local failure = ctx:failure()
    if failure == "status" then
        local st = ctx:upstream_status()
        if conf._same[st] then
            action = attempt <= conf.same_account_retries and "same" or "other"
        elseif conf._other[st] then
            action = "other"
        else
            return "give_up", 0, "status"
        end
    elseif failure == "connect" or failure == "timeout_connect" then
        if not conf.retry_connect then return "give_up", 0, "connect" end
        action = "other"
    elseif failure == "timeout_first_byte" then
        if not conf.retry_first_byte_timeout then return "give_up", 0, "timeout" end
        action = "other"
    else
        -- An idle timeout or reset mid-response: the upstream may have done the work.
        return "give_up", 0, failure
    end

    local cap = min(conf.max_delay_ms, conf.base_delay_ms * 2 ^ (attempt - 1))
    local delay = floor(random() * cap)
    local ra = ctx:retry_after_ms()
    if ra and action == "same" then
        if ra > conf.max_retry_after_ms then
            action = "other"
        elseif ra > delay then
            delay = ra
        end
    end

    local elapsed = ctx:elapsed_ms()
    local deadline = conf.deadline_ms
    local own = ctx:deadline_ms()
    if own and (deadline == 0 or own < deadline) then deadline = own end
    if deadline > 0 and elapsed + delay >= deadline then return "give_up", 0, "deadline" end
    return action, delay, "retry"
end

-- The log value "action:reason", made once per pair (reasons are a fixed set).
local LOG = { same = {}, other = {}, give_up = {} }

function M.on_upstream_error(ctx, conf)
    local action, delay, reason = M._decide(ctx, conf)
    local log = LOG[action][reason]
    if not log then
        log = action .. ":" .. reason
        LOG[action][reason] = log
    end
    ctx:log_field("retry", log)
    if action == "give_up" then
        ctx:give_up()
    else
        ctx:retry(action, delay)
    end
end

return M
