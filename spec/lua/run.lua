-- The runner of the Lua specs: `luajit spec/lua/run.lua spec/lua/test_x.lua [...]`,
-- from the repository root. Each spec file calls describe/it; the runner prints one
-- line per test and closes with "N passed, N failed" (exit 1 if any failed).
package.path = "spec/lua/?.lua;core/lua/?.lua;" .. package.path

local passed, failed = 0, 0
local prefix = {}

function describe(name, fn)
    prefix[#prefix + 1] = name
    fn()
    prefix[#prefix] = nil
end

function it(name, fn)
    local full = table.concat(prefix, " ") .. " " .. name
    local ok, err = xpcall(fn, debug.traceback)
    if ok then
        passed = passed + 1
        print("ok   " .. full)
    else
        failed = failed + 1
        print("FAIL " .. full .. "\n" .. tostring(err))
    end
end

local function show(v)
    if type(v) == "string" then return string.format("%q", v) end
    return tostring(v)
end

function eq(got, want, what)
    if got ~= want then
        error((what and what .. ": " or "") .. "got " .. show(got) .. ", expected " .. show(want), 2)
    end
end

function near(got, want, tol, what)
    if type(got) ~= "number" or math.abs(got - want) > (tol or 1e-9) then
        error((what and what .. ": " or "") .. "got " .. show(got) .. ", expected " .. show(want), 2)
    end
end

function has(s, sub)
    if type(s) ~= "string" or not s:find(sub, 1, true) then
        error("expected " .. show(s) .. " to contain " .. show(sub), 2)
    end
end

for i = 1, #arg do
    local fn, err = loadfile(arg[i])
    if not fn then
        print("FAIL " .. arg[i] .. ": " .. err)
        failed = failed + 1
    else
        fn()
    end
end
print(string.format("%d passed, %d failed", passed, failed))
os.exit(failed == 0 and passed > 0 and 0 or 1)
