-- business-hours-model: a different model during business hours.
--
-- During the configured days and hours (in the given UTC offset) each model listed in
-- `models` is replaced by its peak-time counterpart, e.g. a cheaper model while
-- traffic is heavy, or a stronger one while people are at work. Runs after model-map
-- (lower priority), so it sees resolved model names.
-- Example config:
--   { name = "business-hours-model", config = {
--       models = { ["gpt-4o"] = "gpt-4o-mini" }, utc_offset_hours = 9,
--       days = { 1, 2, 3, 4, 5 }, start_hour = 9, end_hour = 18 } }
local P = {
    name = "business-hours-model", priority = 800, version = "1.0.0",
    schema = {
        fields = {
            models = { type = "map", default = {}, keys = { type = "string" },
                values = { type = "string", between = { 1, 127 } } },
            utc_offset_hours = { type = "number", default = 0, between = { -12, 14 } },
            days = { type = "array", default = { 1, 2, 3, 4, 5 },
                elements = { type = "integer", between = { 1, 7 } },
                description = "ISO weekdays: 1 = Monday ... 7 = Sunday" },
            start_hour = { type = "integer", default = 9, between = { 0, 23 } },
            end_hour = { type = "integer", default = 18, between = { 1, 24 } },
        },
    },
}

function P.init(conf)
    conf._days = {}
    for _, d in ipairs(conf.days) do conf._days[d] = true end
end

-- True when `now_ms` (ms since the epoch) falls in business hours.
function P._in_hours(conf, now_ms)
    local t = math.floor(now_ms / 1000 + conf.utc_offset_hours * 3600)
    local day = math.floor(t / 86400)
    local weekday = (day + 3) % 7 + 1 -- 1970-01-01 was a Thursday (ISO 4)
    local hour = math.floor(t % 86400 / 3600)
    return conf._days[weekday] == true and hour >= conf.start_hour and hour < conf.end_hour
end

function P.map_model(ctx, conf)
    local to = conf.models[ctx:model()]
    if to and P._in_hours(conf, ctx:now_ms()) then
        ctx:log_field("business_hours", ctx:model() .. "->" .. to)
        ctx:set_model(to)
    end
end

return P
