-- wrk script for spec/bench/routing_bench.sh: one small non-stream chat request with
-- the key of the group under test (TG_RB_KEY), the same for every group, so the only
-- difference between runs is how many accounts the key's group has. At the end it
-- prints one line "statuses: 200=N 429=M ..." so a run that was refused is visible.
wrk.method = "POST"
wrk.body = '{"model":"mock-gpt","max_tokens":8,"messages":[{"role":"user","content":"hello [mock chunks=2]"}]}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. assert(os.getenv("TG_RB_KEY"), "TG_RB_KEY is not set")

local threads = {}

function setup(thread)
    table.insert(threads, thread)
end

function init()
    statuses = {}
end

function response(status)
    statuses[status] = (statuses[status] or 0) + 1
end

function done()
    local total = {}
    for _, t in ipairs(threads) do
        for status, n in pairs(t:get("statuses")) do
            total[status] = (total[status] or 0) + n
        end
    end
    local keys = {}
    for status in pairs(total) do keys[#keys + 1] = status end
    table.sort(keys)
    local parts = {}
    for _, status in ipairs(keys) do parts[#parts + 1] = status .. "=" .. total[status] end
    io.write("statuses: " .. table.concat(parts, " ") .. "\n")
end
