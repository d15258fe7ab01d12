-- The Lua half of the plugin runtime (core/src/policy/tg_plugin.c is the C half). One copy
-- runs in each worker's lua_State. It loads plugins into sandboxes, validates them,
-- and builds a *generation*: the sorted plugin list plus one dispatcher closure per
-- hook. C calls a dispatcher once per hook per request with the request's
-- tg_hookctx_t; the dispatcher runs the plugins in priority order (highest first)
-- until one decides, and returns 0, or the failing plugin's index and its error.
-- (A hook with a single plugin is called without one: C calls the plugin itself.)
--
-- Plugins see `ctx`, an object whose methods read the C context directly through the
-- FFI (declared by tg_cdef, checked against tg_ffi.h) and change it only through
-- tg_ffi_* functions that check the hook: calling one outside its hooks raises
-- "API disabled in the context of <hook>". Plugins never touch cdata themselves.
--
-- Plugin code runs with the JIT off (jit.off(chunk, true)) so that the instruction
-- budget hook set by C fires inside plugin loops, except the functions that cannot
-- loop (see M.compile); this file's own code stays JIT-compiled (its loops run over
-- its own finite lists, whatever plugin function they call). See plugins/README.md,
-- "Isolation".
--
-- Cost. Plugin loops run interpreted, and in the interpreter every cdata access is a
-- metamethod call into C that allocates. So cdata is touched only in the small Ctx
-- methods, which plugins call often enough that each becomes its own compiled trace:
-- C writes the hook's context into `cell` (C memory, so compiled code reloads it on
-- every call), there is no cast or argument per call, and a method returns a local
-- rather than tail-calling (a tail call into ffi.string would end its trace in the
-- plugin's frame, which the JIT refuses, leaving the method interpreted). A method's
-- trace also cannot grow a second path for its branches (that too would return into
-- the plugin's frame), so the methods avoid branches that flip from call to call. A
-- hook that one plugin implements is called by C directly, without a dispatcher.
local ffi = require("ffi")
local jit = require("jit")
require("tg_cdef")
local schema = require("tg_schema")

local C = ffi.C
-- tg_ffi_* functions, resolved on first use and kept: plugin code runs interpreted,
-- where a plain table lookup is much cheaper than a lookup in the ffi.C namespace.
local F = setmetatable({}, { __index = function(t, k)
    local f = C[k]
    rawset(t, k, f)
    return f
end })
local ffi_string = ffi.string
local strout_t = ffi.typeof("const char *[1]")
local lenout_t = ffi.typeof("size_t[1]")

local M = {}

local HOOKS = { "on_request", "map_model", "select_account", "on_upstream_error",
    "on_limiter_down", "price", "on_log" }
local HOOK_ID = {}
for i, name in ipairs(HOOKS) do HOOK_ID[name] = i - 1 end
M.HOOKS = HOOKS

-- Raised by the C instruction/time budget hook; pcall inside a plugin cannot swallow it.
M.BUDGET_PREFIX = "plugin budget exceeded"

local FAILURES = { [0] = "status", "connect", "timeout_connect", "timeout_first_byte",
    "timeout_idle", "reset" }
local LOG_LEVELS = { error = 0, warn = 1, info = 2, debug = 3 }

---------------------------------------------------------------------------------------
-- The context object. cell.ctx is the C context of the hook call running now: C sets
-- it before a hook call and clears it after (NULL between hook calls). Layout:
-- tg_ctxcell_t in tg_plugin_internal.h.

local cell = ffi.new("struct { tg_hookctx_t *ctx; }")
-- Where C writes (read once per lua_State by tg_plugin.c).
M.cell_address = tonumber(ffi.cast("uintptr_t", ffi.cast("void *", cell)))

-- Per hook call: the account views, whether a plugin decided.
local accounts = {}     -- reused views of the accounts (Lua tables, filled per call)
local naccounts = 0
local decided = false   -- a plugin decided (the Lua mirror of ctx->decided)
local hdr_val, hdr_len = strout_t(), lenout_t()

-- The context, or an error for a ctx kept and used after its hook call ended.
local function cur()
    local c = cell.ctx
    if c == nil then error("ctx used outside a hook call", 3) end
    return c
end

local function fail(rc, what)
    if rc == -1 then
        local c = cell.ctx
        local hook = c ~= nil and HOOKS[c.hook + 1] or "none (outside a hook call)"
        error("API " .. what .. " disabled in the context of " .. hook, 3)
    end
    local msg = rc == -2 and "bad argument" or rc == -3 and "not found"
        or rc == -4 and "value too long" or rc == -5 and "already decided" or "error " .. rc
    return nil, msg
end

local function str(s, what)
    if type(s) ~= "string" then
        error(what .. ": expected string, got " .. type(s), 3)
    end
    return s
end

-- id and region are strings: made only when a plugin reads them.
local account_mt = {
    __index = function(t, k)
        if k ~= "id" and k ~= "region" then return nil end
        local c = cur()
        local i = t.index_
        if i > c.naccounts then return nil end -- a view kept from another request
        local a = c.accounts[i - 1]
        local v
        if k == "id" then v = ffi_string(a.id, a.id_len) else v = ffi_string(a.region, a.region_len) end
        rawset(t, k, v)
        return v
    end,
}

-- The views are filled when a select_account call starts (by its dispatcher, or the
-- wrapper of a single plugin): one compiled loop. Filling them lazily inside the
-- compiled methods would put a branch there whose other side the JIT cannot compile
-- (it would have to return into the plugin's interpreted frame), and every call taking
-- that side would leave the trace and finish interpreted, at many times the cost.
local function refresh_accounts()
    local c = cell.ctx
    local n = c.naccounts
    for i = 1, n do
        local t = accounts[i]
        if not t then
            t = setmetatable({ index_ = i }, account_mt)
            accounts[i] = t
        end
        local a = c.accounts[i - 1]
        t.id = nil
        t.region = nil
        t.priority = a.priority
        t.inflight = a.inflight
        t.max_concurrency = a.max_concurrency
        t.queued = a.queued
        t.sticky = a.sticky ~= 0
        t.tried = a.tried
        t.excluded = a.excluded ~= 0
        t.error_ewma = a.error_ewma
        t.ttft_ewma_ms = a.ttft_ewma_ms
        t.reset_in_ms = a.reset_in_ms
        t.cost = a.cost
        t.score = a.score
        t.trial = a.trial ~= 0
        t.headroom = a.headroom
        t.window_left = a.window_left
        t.window_reset_in_ms = a.window_reset_in_ms
    end
    naccounts = n
end

local Ctx = {}
local band = require("bit").band

function Ctx:hook() local c = cur() return HOOKS[c.hook + 1] end
function Ctx:request_id() local c = cur() local v = ffi_string(c.request_id, c.request_id_len) return v end
function Ctx:route() local c = cur() local v = ffi_string(c.route, c.route_len) return v end
function Ctx:protocol() local c = cur() local v = ffi_string(c.protocol, c.protocol_len) return v end
function Ctx:key_id() local c = cur() local v = ffi_string(c.key_id, c.key_id_len) return v end
function Ctx:tenant_id() local c = cur() local v = ffi_string(c.tenant_id, c.tenant_id_len) return v end
-- No per-call cache: it would need a branch (see refresh_accounts); interning a
-- short string that exists already is cheap.
function Ctx:model() local c = cur() local v = ffi_string(c.model, c.model_len) return v end
function Ctx:original_model()
    local c = cur()
    local v = ffi_string(c.original_model, c.original_model_len)
    return v
end
function Ctx:group() local c = cur() local v = ffi_string(c.group, c.group_len) return v end
function Ctx:stream() local c = cur() return c.stream ~= 0 end
function Ctx:generation() local c = cur() local v = tonumber(c.generation) return v end
function Ctx:now_ms() local c = cur() return c.now_ms end
function Ctx:worker() local c = cur() return c.worker end
function Ctx:nworkers() local c = cur() return c.nworkers end
function Ctx:max_tokens()
    local v = cur().max_tokens
    if v < 0 then return nil end
    v = tonumber(v)
    return v
end

function Ctx:header(name)
    local c = cur()
    str(name, "header")
    if F.tg_ffi_header(c, name, #name, hdr_val, hdr_len) ~= 0 then return nil end
    local v = ffi_string(hdr_val[0], hdr_len[0])
    return v
end

-- Plain Lua (the views): no cdata, so nothing to check about the cell.
function Ctx:naccounts() return naccounts end
function Ctx:account(i)
    if type(i) ~= "number" or i < 1 or i > naccounts then return nil end
    return accounts[i]
end
function Ctx:selected()
    local s = cur().selected
    if s < 0 then return nil end
    return s + 1
end

function Ctx:attempt() local c = cur() return c.attempt end
function Ctx:upstream_status() local c = cur() return c.upstream_status end
function Ctx:failure() local c = cur() return FAILURES[c.failure] or "status" end
function Ctx:bytes_sent() local c = cur() return c.bytes_sent ~= 0 end
function Ctx:retry_after_ms()
    local v = cur().retry_after_ms
    if v < 0 then return nil end
    v = tonumber(v)
    return v
end
function Ctx:elapsed_ms() local v = tonumber(cur().elapsed_ms) return v end
function Ctx:deadline_ms()
    local v = cur().deadline_ms
    if v <= 0 then return nil end
    v = tonumber(v)
    return v
end

-- limits() and usage() return a fresh table each call, copied from a constant
-- constructor that has every key (one allocation, no key insertion); absent entries
-- are then set to nil, which a plugin cannot tell from a key never set.

function Ctx:limits()
    local bits = cur().limits
    local t = { rate = true, tokens = true, concurrency = true, money = true }
    if band(bits, 1) == 0 then t.rate = nil end
    if band(bits, 2) == 0 then t.tokens = nil end
    if band(bits, 4) == 0 then t.concurrency = nil end
    if band(bits, 8) == 0 then t.money = nil end
    return t
end

function Ctx:usage()
    local c = cur()
    local k = tonumber(c.usage_known)
    local t = { input = 0, output = 0, cache_read = 0, cache_write = 0, reasoning = 0 }
    if band(k, 1) ~= 0 then t.input = tonumber(c.usage_input) else t.input = nil end
    if band(k, 2) ~= 0 then t.output = tonumber(c.usage_output) else t.output = nil end
    if band(k, 4) ~= 0 then t.cache_read = tonumber(c.usage_cache_read) else t.cache_read = nil end
    if band(k, 8) ~= 0 then t.cache_write = tonumber(c.usage_cache_write) else t.cache_write = nil end
    if band(k, 16) ~= 0 then t.reasoning = tonumber(c.usage_reasoning) else t.reasoning = nil end
    return t
end
function Ctx:cost_nanousd()
    local v = cur().cost_nanousd
    if v < 0 then return nil end
    v = tonumber(v)
    return v
end
function Ctx:status() local c = cur() return c.status end
function Ctx:ttft_ms()
    local v = cur().ttft_ms
    if v < 0 then return nil end
    return v
end
function Ctx:total_ms() local c = cur() return c.total_ms end

function Ctx:set_model(m)
    local c = cur()
    str(m, "set_model")
    local rc = F.tg_ffi_set_model(c, m, #m)
    if rc ~= 0 then return fail(rc, "set_model") end
    return true
end

function Ctx:set_group(g)
    local c = cur()
    str(g, "set_group")
    local rc = F.tg_ffi_set_group(c, g, #g)
    if rc ~= 0 then return fail(rc, "set_group") end
    return true
end

-- The functions that decide (tg_ffi_reject, _select, _retry, _limiter, _set_cost set
-- ctx->decided) also set `decided`, which the dispatcher reads instead of the cdata.
function Ctx:reject(status, code, message)
    local c = cur()
    code = str(code or "rejected_by_policy", "reject")
    message = str(message or "rejected by policy", "reject")
    local rc = F.tg_ffi_reject(c, tonumber(status) or 0, code, #code, message, #message)
    if rc ~= 0 then return fail(rc, "reject") end
    decided = true
    return true
end

function Ctx:exclude(i)
    local c = cur()
    i = tonumber(i) or 0
    if i % 1 ~= 0 then return nil, "bad argument" end
    local rc = F.tg_ffi_exclude(c, i - 1)
    if rc ~= 0 then return fail(rc, "exclude") end
    accounts[i].excluded = true
    return true
end

-- The score goes into the Lua view (what ctx:account(i).score reads) and the C
-- account (logs, workbench) at once: no writing back after the hook.
function Ctx:set_score(i, s)
    local c = cur()
    if c.hook ~= 2 then return fail(-1, "set_score") end
    s = tonumber(s)
    if type(i) ~= "number" or i < 1 or i > naccounts or not s or s ~= s then
        return nil, "bad argument"
    end
    accounts[i].score = s
    c.accounts[i - 1].score = s
    return true
end

-- score_accounts(fn [, arg [, k]]): the per-account loop a scoring policy would
-- write, run here so that it can run compiled (a plugin's own loops are interpreted:
-- plugins/README.md, Isolation). For each account that is not excluded, in order,
-- s = fn(view, arg); a number is set as its score (as set_score) and ranked, nil
-- leaves it unscored. Returns n and two arrays: the n (at most k, default 1) best
-- accounts' indexes and scores, highest first, ties in account order. The arrays are
-- reused by the next call: copy what must outlive it. A loop-free fn runs compiled
-- inside this loop, which is bounded by the number of accounts; one with a loop runs
-- interpreted, under the budget like any plugin loop.
local top_idx, top_score, scored = {}, {}, {}
-- Raises score_accounts's error for score s of account i (at its caller's caller).
function M.bad_score(s, i)
    error("score_accounts: the function returned " .. tostring(s) .. " for account " .. i ..
        " (expected a number or nil)", 3)
end
function Ctx:score_accounts(fn, arg, k)
    local c = cur()
    if c.hook ~= 2 then return fail(-1, "score_accounts") end
    if type(fn) ~= "function" then error("score_accounts: expected function, got " .. type(fn), 2) end
    k = tonumber(k) or 1
    -- Two passes: the scores first (fn compiled into one loop whose path does not
    -- depend on the scores), then the ranking, whose nested loop would otherwise split
    -- that loop's trace differently from one run to the next.
    local ca = c.accounts
    for i = 1, naccounts do
        local a = accounts[i]
        local s = false
        if not a.excluded then
            s = fn(a, arg)
            if s == nil then
                s = false
            elseif type(s) ~= "number" or s ~= s then
                M.bad_score(s, i)
            else
                a.score = s
                ca[i - 1].score = s
            end
        end
        scored[i] = s
    end
    -- Insertion into the descending list, at most k long (kth is its last score once
    -- full): from the slot it fills up past every lower score; ties keep account order.
    local n, kth = 0, 0
    for i = 1, naccounts do
        local s = scored[i]
        if s and (n < k or (n > 0 and s > kth)) then
            local pos = n
            if n < k then
                n = n + 1
                pos = n
            end
            while pos > 1 and top_score[pos - 1] < s do
                top_idx[pos], top_score[pos] = top_idx[pos - 1], top_score[pos - 1]
                pos = pos - 1
            end
            top_idx[pos], top_score[pos] = i, s
            kth = top_score[n]
        end
    end
    return n, top_idx, top_score
end

function Ctx:select(i)
    local rc = F.tg_ffi_select(cur(), (tonumber(i) or 0) - 1)
    if rc ~= 0 then return fail(rc, "select") end
    decided = true
    return true
end

local RETRY = { give_up = 0, same = 1, other = 2 }
function Ctx:retry(action, delay_ms)
    local c = cur()
    local a = RETRY[action]
    if not a then error("retry: action must be 'same', 'other' or 'give_up'", 2) end
    local rc = F.tg_ffi_retry(c, a, math.floor(tonumber(delay_ms) or 0))
    if rc ~= 0 then return fail(rc, "retry") end
    decided = true
    return true
end
function Ctx:give_up() return self:retry("give_up", 0) end

-- limiter(decision [, limit]) or limiter({ rate = decision, money = decision, ... }):
-- decision is "closed", "open" or "local" (money: closed or open); without a limit it
-- applies to every limit the request has. Limits left undecided take the configured
-- policy.
local LIMITER = { closed = 0, open = 1, ["local"] = 2 }
local LIMIT_BIT = { rate = 1, tokens = 2, concurrency = 4, money = 8 }
local MONEY_LOCAL = "limiter: money is 'closed' or 'open' (a local money bucket would let every instance spend the whole balance)"
function Ctx:limiter(decision, limit)
    local c = cur()
    if type(decision) == "table" then
        for name, d in pairs(decision) do
            local bit = LIMIT_BIT[name]
            if not bit then error("limiter: unknown limit '" .. tostring(name) .. "'", 2) end
            local v = LIMITER[d]
            if not v then error("limiter: decision must be 'closed', 'open' or 'local'", 2) end
            if bit == 8 and v == 2 then error(MONEY_LOCAL, 2) end
            local rc = F.tg_ffi_limiter(c, bit, v)
            if rc ~= 0 then return fail(rc, "limiter") end
        end
        decided = true
        return true
    end
    local d = LIMITER[decision]
    if not d then error("limiter: decision must be 'closed', 'open' or 'local'", 2) end
    local bit = 0
    if limit ~= nil then
        bit = LIMIT_BIT[limit]
        if not bit then error("limiter: unknown limit '" .. tostring(limit) .. "'", 2) end
        if bit == 8 and d == 2 then error(MONEY_LOCAL, 2) end
    end
    local rc = F.tg_ffi_limiter(c, bit, d)
    if rc ~= 0 then return fail(rc, "limiter") end
    decided = true
    return true
end

function Ctx:set_cost(nanousd)
    local rc = F.tg_ffi_set_cost(cur(), tonumber(nanousd) or -1)
    if rc ~= 0 then return fail(rc, "set_cost") end
    decided = true
    return true
end

function Ctx:add_header(name, value)
    local c = cur()
    str(name, "add_header")
    value = tostring(value)
    local rc = F.tg_ffi_add_header(c, name, #name, value, #value)
    if rc ~= 0 then return fail(rc, "add_header") end
    return true
end

function Ctx:log_field(key, value)
    local c = cur()
    str(key, "log_field")
    value = tostring(value)
    local rc = F.tg_ffi_log_field(c, key, #key, value, #value)
    if rc ~= 0 then return fail(rc, "log_field") end
    return true
end

function Ctx:log(level, msg)
    local c = cur()
    local l = LOG_LEVELS[level]
    if not l then error("log: level must be error, warn, info or debug", 2) end
    msg = tostring(msg)
    F.tg_ffi_log(c, l, msg, #msg)
    return true
end

-- The one context object plugins receive. Its state lives in upvalues, not in the
-- table, so a plugin cannot reach the cdata.
local ctx = setmetatable({}, {
    __index = Ctx,
    __newindex = function() error("ctx is read-only; use its methods", 2) end,
    __metatable = "ctx",
})
M.ctx = ctx

---------------------------------------------------------------------------------------
-- The `tollgate` module plugins may require.

local api = {
    version = "0.1.0",
    hooks = HOOKS,
    now_ms = function()
        local c = cell.ctx
        if c ~= nil then return c.now_ms end
        return os.time() * 1000
    end,
    monotonic_ms = function() return F.tg_ffi_monotonic_ms() end,
}
M.api = api

---------------------------------------------------------------------------------------
-- Sandboxes.

local function copy(t, drop)
    local out = {}
    for k, v in pairs(t) do
        if not (drop and drop[k]) then out[k] = v end
    end
    return out
end

local raw_pcall, raw_xpcall, raw_error = pcall, xpcall, error
local BUDGET = M.BUDGET_PREFIX

local function rethrow_budget(ok, ...)
    if not ok then
        local e = ...
        if type(e) == "string" and e:find(BUDGET, 1, true) then raw_error(e, 0) end
    end
    return ok, ...
end

local function safe_pcall(f, ...) return rethrow_budget(raw_pcall(f, ...)) end
local function safe_xpcall(f, h, ...) return rethrow_budget(raw_xpcall(f, h, ...)) end

local function safe_getmetatable(v)
    if type(v) == "string" then return nil end
    return getmetatable(v)
end

local SAFE_STRING = copy(string, { dump = true })
local SAFE_TABLE = copy(table)
local SAFE_MATH = copy(math)
local SAFE_BIT = copy(require("bit"))
local SAFE_OS = { time = os.time, clock = os.clock, date = os.date, difftime = os.difftime }

-- A fresh global table for one plugin. `require` gives only the tollgate module.
function M.sandbox(name)
    local env = {
        assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs,
        pcall = safe_pcall, xpcall = safe_xpcall, select = select, tonumber = tonumber,
        tostring = tostring, type = type, unpack = unpack, rawequal = rawequal,
        rawget = rawget, rawset = rawset, setmetatable = setmetatable,
        getmetatable = safe_getmetatable, _VERSION = _VERSION,
        string = SAFE_STRING, table = SAFE_TABLE, math = SAFE_MATH, bit = SAFE_BIT,
        os = SAFE_OS,
    }
    env.require = function(mod)
        if mod == "tollgate" then return api end
        error("plugin " .. name .. ": require('" .. tostring(mod) ..
            "') is not allowed (plugins may require only 'tollgate')", 2)
    end
    env._G = env
    return env
end

-- Which plugin functions may be compiled. A function qualifies when its bytecode has
-- no loop (FORL, ITERL, ITERN, LOOP and their variants), no backward jump (a `goto`
-- loop is a plain JMP or UCLO backwards) and no tail call (CALLT, CALLMT: tail
-- recursion, direct or mutual, is a loop that does not grow the stack). Every other
-- function stays interpreted. Then compiled plugin code cannot run forever on its own:
-- an endless run must keep passing a loop back-edge or a tail call (recursion that
-- grows the stack ends at its limit), and those are all in interpreted functions,
-- where the budget's count hook fires. See plugins/README.md, "Isolation".
-- Off (everything interpreted) when max_instructions counts every instruction, or when
-- the opcode names cannot be read.
M.jit_plugins = false
local bcnames = {}
do
    local ok, vmdef = pcall(require, "jit.vmdef")
    if ok and type(vmdef) == "table" and type(vmdef.bcnames) == "string" then
        local names = vmdef.bcnames
        for i = 0, #names / 6 - 1 do
            bcnames[i] = names:sub(i * 6 + 1, i * 6 + 6):gsub(" +$", "")
        end
    end
end
local NO_JIT_OPS = { FORL = true, IFORL = true, JFORL = true, ITERL = true, IITERL = true,
    JITERL = true, ITERN = true, LOOP = true, ILOOP = true, JLOOP = true, CALLT = true,
    CALLMT = true }
local BACKWARD_OPS = { JMP = true, UCLO = true, ISNEXT = true }
local jutil = require("jit.util")
local rshift = require("bit").rshift

-- Whether the function or prototype `f` may run compiled (see above).
local function may_compile(f)
    local info = jutil.funcinfo(f)
    for pc = 1, info.bytecodes - 1 do
        local ins = jutil.funcbc(f, pc)
        if not ins then return false end
        local name = bcnames[ins % 256]
        if name == nil or NO_JIT_OPS[name] then return false end
        -- The jump's target is pc + 1 + (D - 0x8000).
        if BACKWARD_OPS[name] and rshift(ins, 16) < 0x8000 then return false end
    end
    return true
end
M._may_compile = may_compile

-- Switches the JIT back on for the functions `f` defines that qualify, at any depth.
local function jit_on_qualifying(f)
    local info = jutil.funcinfo(f)
    if not info.children then return end
    for i = -1, -info.gcconsts, -1 do
        local k = jutil.funck(f, i)
        if type(k) == "proto" then
            if may_compile(k) then jit.on(k) end
            jit_on_qualifying(k)
        end
    end
end

-- Compiles plugin source into a function running in `env`, with the JIT off for it
-- and every function it defines that has a loop, a backward jump or a tail call (so
-- the budget hook can interrupt its loops), on for the others when M.jit_plugins.
function M.compile(src, chunkname, env)
    if src:byte(1) == 27 then return nil, chunkname:sub(2) .. ": bytecode is not accepted" end
    local fn, err = load(src, chunkname, "t", env)
    if not fn then return nil, err end
    jit.off(fn, true)
    if M.jit_plugins and bcnames[0] then jit_on_qualifying(fn) end
    return fn
end

---------------------------------------------------------------------------------------
-- Generations.

local HANDLER_KEYS = { name = true, priority = true, version = true, schema = true,
    init = true, destroy = true, fail_closed = true, description = true }

-- Loads, checks and configures one plugin. `p` comes from C: name, handler_src,
-- handler_file, schema_src (or nil), schema_file, config_src. Returns the plugin, or
-- nil, err and (when the handler itself loaded) the handler table.
local function load_plugin(p)
    local prefix = "plugins." .. p.name
    local env = M.sandbox(p.name)
    local fn, err = M.compile(p.handler_src, "@" .. p.handler_file, env)
    if not fn then return nil, prefix .. ": " .. err end
    local ok, h = pcall(fn)
    if not ok then return nil, prefix .. ": " .. tostring(h) end
    if type(h) ~= "table" then
        return nil, prefix .. ": " .. p.handler_file .. " must return a table, got " .. type(h)
    end
    if h.name ~= p.name then
        return nil, prefix .. ": " .. p.handler_file .. " has name = " .. tostring(h.name) ..
            ", expected \"" .. p.name .. "\""
    end
    if type(h.priority) ~= "number" or h.priority ~= math.floor(h.priority) then
        return nil, prefix .. ".priority: expected integer, got " .. type(h.priority)
    end
    if type(h.version) ~= "string" then
        return nil, prefix .. ".version: expected string, got " .. type(h.version)
    end
    local hooks = {}
    for k, v in pairs(h) do
        if HOOK_ID[k] then
            if type(v) ~= "function" then
                return nil, prefix .. "." .. k .. ": expected function, got " .. type(v)
            end
            hooks[#hooks + 1] = k
        elseif not HANDLER_KEYS[k] and not (type(k) == "string" and k:sub(1, 1) == "_") then
            return nil, prefix .. ": unknown key '" .. tostring(k) .. "' (hooks are " ..
                table.concat(HOOKS, ", ") .. ")"
        end
    end
    table.sort(hooks, function(a, b) return HOOK_ID[a] < HOOK_ID[b] end)

    local sch = h.schema
    if p.schema_src then
        local sfn, serr = M.compile(p.schema_src, "@" .. p.schema_file, M.sandbox(p.name))
        if not sfn then return nil, prefix .. ".schema: " .. serr, h end
        local sok, s = pcall(sfn)
        if not sok then return nil, prefix .. ".schema: " .. tostring(s), h end
        sch = s
    end
    sch = sch or { fields = {} }
    local sok, serr = schema.check_schema(sch, prefix .. ".schema")
    if not sok then return nil, serr, h end

    local cfn, cerr = load("return " .. (p.config_src or "{}"), "=" .. prefix .. ".config", "t", {})
    if not cfn then return nil, prefix .. ".config: " .. cerr, h end
    local cok, raw = pcall(cfn)
    if not cok then return nil, prefix .. ".config: " .. tostring(raw), h end
    local conf, verr = schema.validate(sch, raw, prefix .. ".config")
    if not conf then return nil, verr, h end

    if h.init then
        if type(h.init) ~= "function" then return nil, prefix .. ".init: expected function", h end
        local iok, ierr = pcall(h.init, conf)
        if not iok then return nil, prefix .. ".init: " .. tostring(ierr), h end
    end
    return {
        name = p.name, version = h.version, priority = h.priority, handler = h,
        conf = conf, hooks = hooks, file = p.handler_file, fail_closed = h.fail_closed == true,
    }
end

local function make_dispatch(hook_id, list)
    local n = #list
    local fns, confs = {}, {}
    for i = 1, n do
        fns[i] = list[i].handler[HOOKS[hook_id + 1]]
        confs[i] = list[i].conf
    end
    -- Called by C with the context in the cell; no cdata is touched here (see the top).
    -- confs[i] is this generation's (or this group's) config of plugin i.
    local with_accounts = hook_id == HOOK_ID.select_account
    local dispatch = function()
        decided = false
        if with_accounts then refresh_accounts() end
        for i = 1, n do
            local ok, e = pcall(fns[i], ctx, confs[i])
            if not ok then return i, tostring(e) end
            if decided then break end
        end
        return 0
    end
    -- It calls plugin code, where no trace can go: without this the JIT would keep
    -- trying (and failing) to record it, which costs more than interpreting it.
    jit.off(dispatch)
    return dispatch
end

-- Sorts `list` (priority, highest first; ties by `order`) and builds its dispatchers.
local function assemble(list, number)
    table.sort(list, function(a, b)
        if a.priority ~= b.priority then return a.priority > b.priority end
        return a.order < b.order
    end)
    local gen = { number = number, plugins = list, dispatch = {}, names = {},
        fail_closed = {}, single = {} }
    for id = 0, #HOOKS - 1 do
        local sub, names, closed = {}, {}, {}
        for _, pl in ipairs(list) do
            if pl.handler[HOOKS[id + 1]] then
                sub[#sub + 1] = pl
                names[#names + 1] = pl.name
                closed[#closed + 1] = pl.fail_closed
            end
        end
        gen.dispatch[id] = #sub > 0 and make_dispatch(id, sub) or false
        gen.names[id] = names
        gen.fail_closed[id] = closed
        -- One plugin: C calls its function with (ctx, conf) itself, without the
        -- dispatcher's loop and pcall; for select_account through a wrapper that fills
        -- the account views first (a tail call: the plugin's frame is where the
        -- dispatcher's call put it).
        gen.single[id] = false
        if #sub == 1 then
            local fn = sub[1].handler[HOOKS[id + 1]]
            if id == HOOK_ID.select_account then
                local plugin_fn = fn
                fn = function(c, conf)
                    refresh_accounts()
                    return plugin_fn(c, conf)
                end
                jit.off(fn) -- it calls plugin code (see make_dispatch)
            end
            gen.single[id] = { fn, sub[1].conf }
        end
    end
    return gen
end

-- Builds a generation from `spec` = {generation = N, plugins = {...}}. Returns the
-- generation table or nil, err. The table holds `dispatch[hook_id]` (a function or
-- false), `single[hook_id]` ({fn, conf} when one plugin implements it, else false),
-- `plugins` (sorted), and `fail_closed[hook_id]` lists.
function M.build(spec)
    local list = {}
    for i, p in ipairs(spec.plugins) do
        local pl, err = load_plugin(p)
        if not pl then return nil, err end
        pl.order = i
        list[#list + 1] = pl
    end
    return assemble(list, spec.generation)
end

-- A plugin a group enables but whose config (or code) does not load: it fails in
-- on_request, last of all, so its error is counted and logged per request and the
-- hook's fallback applies (500 when the handler is fail_closed); the plugins that
-- loaded are unaffected. Its other hooks are absent, i.e. their defaults.
local function failing(name, err, h)
    local msg = "group config does not load: " .. err
    return {
        name = name, version = h and type(h.version) == "string" and h.version or "?",
        priority = -math.huge, conf = {}, hooks = { "on_request" },
        handler = { on_request = function() error(msg, 0) end },
        fail_closed = h ~= nil and h.fail_closed == true,
    }
end

-- Builds a group's variant of generation `base`. `spec` = {group = "id", error = nil
-- or why the setting could not be read, plugins = {{name, enabled, config_src (nil:
-- none given), handler_src (nil: not found), handler_file, schema_src, schema_file},
-- ...}}. The config file's list is the start; an entry with enabled = false removes
-- its plugin; an enabled entry with a config adds the plugin (a fresh instance: own
-- module state, own init) or replaces the config file's instance; an enabled entry
-- without a config keeps the config file's instance, or adds the plugin with its
-- defaults. An entry with shadow = true leaves the live list alone: its plugin goes to
-- `shadow`, a generation run beside the live one whose decisions are only compared.
-- Always returns a generation table; `errors` lists what did not load.
function M.build_variant(base, spec)
    local over, names, shadows = {}, {}, {}
    for _, o in ipairs(spec.plugins) do
        if o.shadow then
            shadows[#shadows + 1] = o
        else
            over[o.name] = o
            names[#names + 1] = o.name
        end
    end
    table.sort(names)
    table.sort(shadows, function(a, b) return a.name < b.name end)
    local list, present, errors = {}, {}, {}
    for _, pl in ipairs(base.plugins) do
        present[pl.name] = true
        local o = over[pl.name]
        if not o or (o.enabled and not o.config_src) then list[#list + 1] = pl end
    end
    local function add(pl, i)
        pl.order = #base.plugins + i
        pl.owned = true
        list[#list + 1] = pl
    end
    if spec.error then
        errors[1] = spec.error
        add(failing("group", spec.error), 0)
    end
    for i, name in ipairs(names) do
        local o = over[name]
        if o.enabled and (o.config_src or not present[name]) then
            local pl, err, h
            if not o.handler_src then
                err = "plugins." .. name .. ": not found in the plugin folders"
            else
                pl, err, h = load_plugin(o)
            end
            if not pl then
                errors[#errors + 1] = err
                pl = failing(name, err, h)
            end
            add(pl, i)
        end
    end
    local gen = assemble(list, base.number)
    gen.variant = true
    gen.group = spec.group
    gen.errors = errors
    -- Shadow plugins: instances of their own, in a generation of their own that C runs
    -- on a copy of the request's context after the live plugins (tg_plugin.c). One that
    -- does not load is left out (its error is reported like the others').
    local slist = {}
    for i, o in ipairs(shadows) do
        if o.enabled then
            local pl, err
            if not o.handler_src then
                err = "plugins." .. o.name .. ": not found in the plugin folders"
            else
                pl, err = load_plugin(o)
            end
            if pl then
                pl.order, pl.owned = i, true
                slist[#slist + 1] = pl
            else
                errors[#errors + 1] = "shadow " .. err
            end
        end
    end
    if #slist > 0 then
        gen.shadow = assemble(slist, base.number)
        gen.shadow.variant = true
        -- The share of requests the shadows run on: the largest any of them asks for.
        local sample = 0
        for _, o in ipairs(shadows) do
            if o.enabled and (o.sample or 1) > sample then sample = o.sample or 1 end
        end
        gen.shadow.sample = sample
    end
    return gen
end

-- Called when the last request of a retired generation ends. A group's variant
-- destroys only the instances it made; the rest belong to its base generation.
function M.destroy(gen)
    for _, pl in ipairs(gen.plugins) do
        if (not gen.variant or pl.owned) and pl.handler.destroy then
            pcall(pl.handler.destroy, pl.conf)
        end
    end
end

-- Validates one config (a Lua table constructor) for a loaded plugin spec `p`.
function M.validate_config(p)
    local pl, err = load_plugin(p)
    if not pl then return nil, err end
    return true
end

return M
