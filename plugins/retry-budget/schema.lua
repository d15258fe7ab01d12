-- retry-budget: how many attempts, how long, how far apart, and which failures retry
-- on the same account, on another one, or not at all.
local statuses = function(default)
    return { type = "array", default = default, elements = { type = "integer", between = { 100, 599 } } }
end
return {
    fields = {
        max_attempts = { type = "integer", default = 3, between = { 1, 10 },
            description = "total attempts, the first included" },
        deadline_ms = { type = "integer", default = 60000, between = { 0, 3600000 },
            description = "no retry may start later than this after the request arrived " ..
                "(0: only the request's own deadline)" },
        base_delay_ms = { type = "integer", default = 100, between = { 0, 60000 } },
        max_delay_ms = { type = "integer", default = 2000, between = { 0, 600000 } },
        max_retry_after_ms = { type = "integer", default = 5000, between = { 0, 600000 },
            description = "honour Retry-After up to this; longer means try another account" },
        same_account_retries = { type = "integer", default = 1, between = { 0, 10 },
            description = "attempts on the same account before moving to another" },
        same_account = statuses({ 500, 502, 503, 504 }),
        other_account = statuses({ 401, 403, 408, 429, 529 }),
        retry_connect = { type = "boolean", default = true,
            description = "connection failures and connect timeouts: another account" },
        retry_first_byte_timeout = { type = "boolean", default = true,
            description = "no first byte in time: another account" },
    },
}
