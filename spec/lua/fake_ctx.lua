-- A fake request context for plugin specs: the same methods as the runtime's ctx
-- (core/lua/tg_runtime.lua), over plain Lua tables, with the same hook checks as the
-- C side (core/src/policy/tg_ffi.c), so a spec catches a plugin calling an API outside its
-- hook. Also loads plugins the way the runtime does: sandbox, schema, init.
--
--   local F = require("fake_ctx")
--   local p, conf = F.load("plugins/router", { top_k = 2 })
--   local ctx = F.new("select_account", { accounts = { {id = "a", priority = 1}, ... } })
--   p.select_account(ctx, conf)
--   eq(ctx.out.selected, 1)
local runtime = require("tg_runtime")
local schema = require("tg_schema")

local M = {}

local ALLOWED = {
    set_model = { on_request = true, map_model = true },
    set_group = { on_request = true, map_model = true },
    reject = { on_request = true, map_model = true, select_account = true },
    add_header = { on_request = true, map_model = true, select_account = true },
    exclude = { select_account = true }, set_score = { select_account = true },
    score_accounts = { select_account = true },
    select = { select_account = true },
    retry = { on_upstream_error = true }, give_up = { on_upstream_error = true },
    limiter = { on_limiter_down = true }, set_cost = { price = true },
}

local function check(self, api)
    local ok = ALLOWED[api]
    if ok and not ok[self._hook] then
        error("API " .. api .. " disabled in the context of " .. self._hook, 3)
    end
end

local ACCOUNT_DEFAULTS = {
    id = "", region = "", priority = 0, inflight = 0, max_concurrency = 0, queued = 0,
    sticky = false, tried = 0, excluded = false, error_ewma = 0, ttft_ewma_ms = -1,
    reset_in_ms = -1, cost = 0, score = 0, trial = false, headroom = -1, window_left = -1,
    window_reset_in_ms = -1,
}

local Ctx = {}
Ctx.__index = Ctx

-- new(hook, fields): fields may set request_id, route, protocol, key_id, tenant_id,
-- model, group, stream, max_tokens, headers (name -> value), now_ms, worker,
-- nworkers, accounts (list), attempt, upstream_status, failure, bytes_sent,
-- retry_after_ms, elapsed_ms, deadline_ms, limits (set), usage, status, ttft_ms.
function M.new(hook, f)
    f = f or {}
    local self = setmetatable({ _hook = hook, _f = f, out = { log = {}, headers = {} } }, Ctx)
    self.out.model = f.model or "gpt-4o-mini"
    self.out.group = f.group or "default"
    self._accounts = {}
    for i, a in ipairs(f.accounts or {}) do
        local t = {}
        for k, v in pairs(ACCOUNT_DEFAULTS) do t[k] = v end
        for k, v in pairs(a) do t[k] = v end
        self._accounts[i] = t
    end
    local hdr = {}
    for k, v in pairs(f.headers or {}) do hdr[k:lower()] = v end
    self._headers = hdr
    return self
end

function Ctx:hook() return self._hook end
function Ctx:request_id() return self._f.request_id or "req-1" end
function Ctx:route() return self._f.route or "chat" end
function Ctx:protocol() return self._f.protocol or "openai_chat" end
function Ctx:key_id() return self._f.key_id or "" end
function Ctx:tenant_id() return self._f.tenant_id or "" end
function Ctx:model() return self.out.model end
function Ctx:original_model() return self._f.model or "gpt-4o-mini" end
function Ctx:group() return self.out.group end
function Ctx:stream() return self._f.stream == true end
function Ctx:generation() return 1 end
function Ctx:now_ms() return self._f.now_ms or 1700000000000 end
function Ctx:worker() return self._f.worker or 0 end
function Ctx:nworkers() return self._f.nworkers or 1 end
function Ctx:max_tokens() return self._f.max_tokens end
function Ctx:header(name) return self._headers[name:lower()] end
function Ctx:naccounts() return #self._accounts end
function Ctx:account(i) return self._accounts[i] end
function Ctx:selected() return self.out.selected end
function Ctx:attempt() return self._f.attempt or 1 end
function Ctx:upstream_status() return self._f.upstream_status or 0 end
function Ctx:failure() return self._f.failure or "status" end
function Ctx:bytes_sent() return self._f.bytes_sent == true end
function Ctx:retry_after_ms() return self._f.retry_after_ms end
function Ctx:elapsed_ms() return self._f.elapsed_ms or 0 end
function Ctx:deadline_ms() return self._f.deadline_ms end
function Ctx:limits() return self._f.limits or {} end
function Ctx:usage() return self._f.usage or {} end
function Ctx:cost_nanousd() return self.out.cost end
function Ctx:status() return self._f.status or 200 end
function Ctx:ttft_ms() return self._f.ttft_ms end
function Ctx:total_ms() return self._f.total_ms or 0 end

function Ctx:set_model(m) check(self, "set_model"); self.out.model = m; return true end
function Ctx:set_group(g) check(self, "set_group"); self.out.group = g; return true end
function Ctx:reject(status, code, msg)
    check(self, "reject")
    self.out.reject = { status = status, code = code, message = msg }
    self.out.decided = true
    return true
end
function Ctx:add_header(n, v) check(self, "add_header"); self.out.headers[n] = tostring(v); return true end
function Ctx:exclude(i)
    check(self, "exclude")
    self._accounts[i].excluded = true
    if self.out.selected == i then self.out.selected = nil end
    return true
end
function Ctx:set_score(i, s) check(self, "set_score"); self._accounts[i].score = s; return true end
-- As the runtime's (core/lua/tg_runtime.lua): fn(view, arg) per account not excluded,
-- a number set as its score and ranked; the best k (default 1), highest first, ties in
-- account order, in arrays reused by the next call.
local top_idx, top_score = {}, {}
function Ctx:score_accounts(fn, arg, k)
    check(self, "score_accounts")
    if type(fn) ~= "function" then error("score_accounts: expected function, got " .. type(fn), 2) end
    k = tonumber(k) or 1
    local ranked = {}
    for i, a in ipairs(self._accounts) do
        if not a.excluded then
            local s = fn(a, arg)
            if s ~= nil then
                if type(s) ~= "number" or s ~= s then runtime.bad_score(s, i) end
                a.score = s
                ranked[#ranked + 1] = { i = i, s = s }
            end
        end
    end
    table.sort(ranked, function(x, y) if x.s ~= y.s then return x.s > y.s end return x.i < y.i end)
    local n = math.min(#ranked, math.max(k, 0))
    for j = 1, n do top_idx[j], top_score[j] = ranked[j].i, ranked[j].s end
    return n, top_idx, top_score
end
function Ctx:select(i)
    check(self, "select")
    local a = self._accounts[i]
    if not a or a.excluded then return nil, "bad argument" end
    self.out.selected = i
    self.out.decided = true
    return true
end
function Ctx:retry(action, delay)
    check(self, "retry")
    if self:bytes_sent() and action ~= "give_up" then return nil, "bad argument" end
    self.out.retry = { action = action, delay_ms = action == "give_up" and 0 or delay }
    self.out.decided = true
    return true
end
function Ctx:give_up() return self:retry("give_up", 0) end
-- out.limiter: limit name -> decision, as the runtime's limiter(decision [, limit]) or
-- limiter({ limit = decision, ... }) would set it (money is never "local").
local DECISIONS = { closed = true, open = true, ["local"] = true }
function Ctx:limiter(d, limit)
    check(self, "limiter")
    local out = self.out.limiter or {}
    local function set(name, v)
        if not DECISIONS[v] then error("limiter: decision must be 'closed', 'open' or 'local'", 3) end
        if name == "money" and v == "local" then error("limiter: money is 'closed' or 'open'", 3) end
        out[name] = v
    end
    if type(d) == "table" then
        for name, v in pairs(d) do set(name, v) end
    elseif limit then
        set(limit, d)
    else
        for name in pairs(self._f.limits or {}) do
            if not (name == "money" and d == "local") then set(name, d) end
        end
    end
    self.out.limiter = out
    self.out.decided = true
    return true
end
function Ctx:set_cost(c)
    check(self, "set_cost")
    self.out.cost = math.floor(c + 0.5)
    self.out.decided = true
    return true
end
function Ctx:log_field(k, v) self.out.log[k] = tostring(v); return true end
function Ctx:log() return true end

-- Loads a plugin folder ("plugins/router") or single-file policy ("policies/x.lua")
-- like the runtime: sandboxed, schema-checked config, init(conf). Returns the handler
-- table and its config, or raises the runtime's error message.
function M.load(path, config)
    local handler_file, schema_file = path, nil
    if not path:match("%.lua$") then
        handler_file, schema_file = path .. "/handler.lua", path .. "/schema.lua"
    end
    local function read(f)
        local h = assert(io.open(f, "rb"))
        local s = h:read("*a")
        h:close()
        return s
    end
    local name = path:match("([^/]+)$"):gsub("%.lua$", "")
    local fn = assert(runtime.compile(read(handler_file), "@" .. handler_file, runtime.sandbox(name)))
    local h = fn()
    local sch = h.schema
    if schema_file then
        sch = assert(runtime.compile(read(schema_file), "@" .. schema_file, runtime.sandbox(name)))()
    end
    assert(schema.check_schema(sch, "plugins." .. name .. ".schema"))
    local conf, err = schema.validate(sch, config, "plugins." .. name .. ".config")
    if not conf then error(err, 2) end
    if h.init then h.init(conf) end
    return h, conf
end

return M
