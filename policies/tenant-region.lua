-- tenant-region: keep a tenant's traffic in its region (data residency).
--
-- Accounts outside the tenant's region are excluded, so the router (lower priority)
-- only ever scores in-region accounts. A tenant not listed may use any region. With
-- strict = true (the default) a pinned tenant with no in-region account left gets a
-- 503 instead of leaking to another region.
-- Until tenants live in the state store, the tenant can also come from a header.
-- Example config:
--   { name = "tenant-region", config = { tenants = { acme = "eu", globex = "us" } } }
local P = {
    name = "tenant-region", priority = 700, version = "1.0.0",
    schema = {
        fields = {
            tenants = { type = "map", default = {}, keys = { type = "string" },
                values = { type = "string", between = { 1, 32 } } },
            tenant_header = { type = "string", default = "x-tenant" },
            strict = { type = "boolean", default = true },
        },
    },
}

function P.select_account(ctx, conf)
    local tenant = ctx:tenant_id()
    if tenant == "" then tenant = ctx:header(conf.tenant_header) or "" end
    local region = conf.tenants[tenant]
    if not region then return end
    local left = 0
    for i = 1, ctx:naccounts() do
        local a = ctx:account(i)
        if a.region ~= region then
            ctx:exclude(i)
        elseif not a.excluded then
            left = left + 1
        end
    end
    ctx:log_field("region", region)
    if left == 0 and conf.strict then
        ctx:reject(503, "no_account_in_region",
            "no upstream account in region " .. region .. " is available for this tenant")
    end
end

return P
