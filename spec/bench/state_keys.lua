-- wrk script for spec/bench/state_bench.sh: the same small non-stream chat request,
-- each one with the next of TG_SB_COUNT API keys, spread evenly over the keys
-- 1..TG_SB_N of the table ('tg-bench-' .. i padded to 43 bytes, the length of the keys
-- tollgate issues). The requests are formatted once, in init.
local n = assert(tonumber(os.getenv("TG_SB_N")), "TG_SB_N is not set")
local count = assert(tonumber(os.getenv("TG_SB_COUNT")), "TG_SB_COUNT is not set")
local body = '{"model":"mock-gpt","messages":[{"role":"user","content":"hello"}]}'
local reqs, k = {}, 0

function init()
    local stride = math.floor(n / count)
    for j = 0, count - 1 do
        local key = string.format("tg-bench-%034d", 1 + j * stride)
        reqs[#reqs + 1] = wrk.format("POST", nil,
            { ["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key }, body)
    end
end

function request()
    k = k % #reqs + 1
    return reqs[k]
end
