-- router: the weights of the account score and the draw among the best K.
local weight = function(default, what)
    return { type = "number", default = default, between = { 0, 1000 }, description = what }
end
return {
    fields = {
        weights = {
            type = "record", default = {},
            fields = {
                priority = weight(1.0, "per priority level"),
                load = weight(4.0, "times inflight/max_concurrency"),
                queue = weight(0.5, "per queued request"),
                error = weight(8.0, "times the error EWMA (0..1)"),
                ttft = weight(1.0, "per second of TTFT EWMA"),
                reset = weight(0.5, "bonus for a rate window that resets soon"),
                headroom = weight(2.0, "times the share of its quota used (1 - headroom), as its provider said"),
                use_it_or_lose_it = weight(3.0,
                    "times the unused share of a plan window that resets within use_it_window_ms"),
                cost = weight(0.05, "per USD per million tokens"),
                sticky = weight(2.0, "bonus for the sticky account while healthy"),
                tried = weight(5.0, "per earlier attempt on the account in this request"),
            },
        },
        top_k = { type = "integer", default = 3, between = { 1, 64 } },
        temperature = {
            type = "number", default = 0.5, between = { 0.001, 100 },
            description = "spread of the weighted draw: weight = exp((score - best) / temperature)",
        },
        reset_window_ms = { type = "number", default = 60000, between = { 1, 86400000 } },
        use_it_window_ms = {
            type = "number", default = 3600000, between = { 1, 604800000 },
            description = "a plan window resetting sooner than this with quota left earns the use-it-or-lose-it bonus",
        },
        sticky_max_error = { type = "number", default = 0.2, between = { 0, 1 } },
        sticky_max_ttft_ms = { type = "number", default = 10000, between = { 0, 600000 } },
        saturated_penalty = {
            type = "number", default = 1000, between = { 0, 1e9 },
            description = "subtracted when inflight >= max_concurrency (chosen only if all are)",
        },
    },
}
