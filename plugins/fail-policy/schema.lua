-- fail-policy: what to do while the shared limiter (Redis) cannot be reached.
local mode = function(default, modes)
    return { type = "string", default = default, one_of = modes }
end
return {
    fields = {
        -- money: no local bucket (each instance would spend the whole balance).
        money = mode("closed", { "closed", "open" }),
        -- local: this plugin's trickle bucket (local_bucket); local_limit: the core's
        -- per-instance bucket of the key's and tenant's own limit.
        rate = mode("local", { "closed", "open", "local", "local_limit" }),
        tokens = mode("local", { "closed", "open", "local", "local_limit" }),
        concurrency = mode("local", { "closed", "open", "local", "local_limit" }),
        local_bucket = {
            type = "record", default = {},
            fields = {
                rate_per_s = { type = "number", default = 5, between = { 0, 1e6 },
                    description = "for the whole instance; each worker gets its share" },
                burst = { type = "number", default = 10, between = { 1, 1e6 } },
                by = { type = "string", default = "tenant", one_of = { "tenant", "key", "global" } },
                max_keys = { type = "integer", default = 10000, between = { 1, 1e7 } },
            },
        },
    },
}
