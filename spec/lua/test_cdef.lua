-- The Lua side's ffi.cdef (core/lua/tg_cdef.lua) must declare exactly what
-- core/include/tollgate/tg_ffi.h declares between its CDEF markers: both are parsed
-- into normalized declarations (comments and whitespace dropped) and compared one by
-- one, and the cdef must be accepted by LuaJIT's own C parser.
local ffi = require("ffi")

local function read(f)
    local h = assert(io.open(f, "rb"))
    local s = h:read("*a")
    h:close()
    return s
end

-- Splits C declarations at top-level semicolons; drops comments and whitespace runs.
local function decls(text)
    text = text:gsub("/%*.-%*/", " "):gsub("//[^\n]*", " ")
    local out, depth, cur = {}, 0, {}
    for ch in text:gmatch(".") do
        cur[#cur + 1] = ch
        if ch == "{" then depth = depth + 1 elseif ch == "}" then depth = depth - 1 end
        if ch == ";" and depth == 0 then
            local d = table.concat(cur):gsub("%s+", " "):gsub("^ ", ""):gsub(" ?([%(%)%{%}%[%];,%*=]) ?", "%1")
            out[#out + 1] = d
            cur = {}
        end
    end
    return out
end

describe("tg_cdef", function()
    local header = read("core/include/tollgate/tg_ffi.h")
    local block = header:match("/%* BEGIN FFI CDEF %*/(.-)/%* END FFI CDEF %*/")
    local cdef = require("tg_cdef")

    it("finds the CDEF block in tg_ffi.h", function()
        assert(block and #block > 100, "no CDEF block in tg_ffi.h")
    end)

    it("declares the same things in the same order", function()
        local a, b = decls(block), decls(cdef)
        for i = 1, math.max(#a, #b) do
            eq(b[i], a[i], "declaration " .. i)
        end
        assert(#a > 10, "too few declarations parsed: " .. #a)
    end)

    it("is accepted by LuaJIT and sizes the context like the header says", function()
        -- tg_cdef already ran ffi.cdef; the types must exist and be usable.
        local ctx = ffi.new("tg_hookctx_t")
        eq(ffi.sizeof(ctx.model), 128)
        eq(ffi.offsetof("tg_hookctx_t", "hook"), 0)
        eq(ffi.C.TG_HOOK__COUNT, 7)
        eq(ffi.C.TG_FFI_EPHASE, -1)
    end)

    it("declares every tg_ffi_ function that tg_ffi.c defines", function()
        local src = read("core/src/policy/tg_ffi.c")
        for name in src:gmatch("\n[%w_ %*]-(tg_ffi_[%w_]+)%(") do
            if name ~= "tg_ffi_hook_name" and name ~= "tg_ffi_strerror" then
                has(cdef, name .. "(")
            end
        end
    end)
end)
