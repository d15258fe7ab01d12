-- pricing: USD per million tokens per model, and a multiplier per group.
local price = { type = "number", between = { 0, 1e6 } }
return {
    fields = {
        models = {
            type = "map", default = {},
            keys = { type = "string", between = { 1, 127 } },
            values = {
                type = "record",
                fields = {
                    input = { type = "number", between = { 0, 1e6 }, required = true },
                    output = { type = "number", between = { 0, 1e6 }, required = true },
                    cache_read = price,
                    cache_write = price,
                    reasoning = price,
                },
            },
            description = "model (or pattern with *) -> prices; cache_read and cache_write " ..
                "default to input, reasoning to output",
        },
        group_multipliers = {
            type = "map", default = {},
            keys = { type = "string" }, values = { type = "number", between = { 0, 1000 } },
        },
        default_multiplier = { type = "number", default = 1, between = { 0, 1000 } },
    },
}
