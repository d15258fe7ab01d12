-- tollgate's facts: who may call, what they may use, which upstream accounts exist,
-- what tokens cost, and what was billed. Money is NUMERIC, never a float. Plain API
-- keys and upstream credentials are never stored: keys as SHA-256, credentials
-- encrypted with AES-256-GCM under TOLLGATE_SECRET_KEY.

CREATE TABLE tenants (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    balance     numeric(24, 10) NOT NULL DEFAULT 0,
    opening_balance numeric(24, 10) NOT NULL DEFAULT 0,
    budget      numeric(24, 10),                -- optional spending cap
    spend       numeric(24, 10) NOT NULL DEFAULT 0,
    status      text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'suspended')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id          bigserial PRIMARY KEY,
    tenant_id   bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    email       text NOT NULL CHECK (length(email) BETWEEN 3 AND 320),
    name        text,
    role        text NOT NULL DEFAULT 'member' CHECK (role IN ('owner', 'admin', 'member')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, email)
);

-- A group is the product boundary: the models offered, a price multiplier, and the
-- plugin configuration that applies to requests of its keys.
CREATE TABLE groups (
    id              bigserial PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    models          text[] NOT NULL DEFAULT '{}',   -- empty: every model its accounts serve
    rate_multiplier numeric(12, 6) NOT NULL DEFAULT 1 CHECK (rate_multiplier >= 0),
    plugins         jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id              bigserial PRIMARY KEY,
    tenant_id       bigint NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    user_id         bigint REFERENCES users (id) ON DELETE SET NULL,
    group_id        bigint REFERENCES groups (id) ON DELETE SET NULL,
    name            text NOT NULL DEFAULT '',
    key_hash        bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    prefix          text NOT NULL,                   -- first characters, for display
    status          text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    expires_at      timestamptz,
    allowed_models  text[],                          -- NULL: every model of the group
    ip_allow        cidr[],                          -- NULL: any address
    rpm             integer CHECK (rpm >= 0),
    tpm             integer CHECK (tpm >= 0),
    concurrency     integer CHECK (concurrency >= 0),
    budget          numeric(24, 10) CHECK (budget >= 0),
    spend           numeric(24, 10) NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE accounts (
    id              bigserial PRIMARY KEY,
    name            text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    provider        text NOT NULL CHECK (provider IN ('openai', 'anthropic')),
    base_url        text NOT NULL CHECK (base_url ~ '^https?://'),
    credential      bytea,                           -- version || nonce || ciphertext || tag
    kind            text NOT NULL DEFAULT 'metered' CHECK (kind IN ('metered', 'subscription')),
    concurrency     integer NOT NULL DEFAULT 16 CHECK (concurrency >= 0),
    priority        integer NOT NULL DEFAULT 0,
    weight          integer NOT NULL DEFAULT 100 CHECK (weight >= 0),
    models          text[] NOT NULL DEFAULT '{}',    -- empty: any model
    model_map       jsonb NOT NULL DEFAULT '{}',     -- client model -> upstream model
    cost_multiplier numeric(12, 6) NOT NULL DEFAULT 1,
    status          text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'disabled')),
    cooldown_until  timestamptz,
    reset_at        timestamptz,                     -- subscription window reset
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE account_groups (
    account_id  bigint NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    group_id    bigint NOT NULL REFERENCES groups (id) ON DELETE CASCADE,
    PRIMARY KEY (account_id, group_id)
);
CREATE INDEX account_groups_group ON account_groups (group_id);

-- Prices per one million tokens.
CREATE TABLE model_prices (
    model       text PRIMARY KEY CHECK (length(model) BETWEEN 1 AND 200),
    input       numeric(20, 10) NOT NULL DEFAULT 0 CHECK (input >= 0),
    output      numeric(20, 10) NOT NULL DEFAULT 0 CHECK (output >= 0),
    cache_read  numeric(20, 10) NOT NULL DEFAULT 0 CHECK (cache_read >= 0),
    cache_write numeric(20, 10) NOT NULL DEFAULT 0 CHECK (cache_write >= 0),
    reasoning   numeric(20, 10),                     -- NULL: priced as output
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per attempt's reservation of the upper bound of its cost.
CREATE TABLE reservations (
    request_id  text NOT NULL,
    attempt     integer NOT NULL DEFAULT 1,
    tenant_id   bigint NOT NULL REFERENCES tenants (id),
    api_key_id  bigint NOT NULL REFERENCES api_keys (id),
    amount      numeric(24, 10) NOT NULL CHECK (amount >= 0),
    state       text NOT NULL DEFAULT 'reserved'
                CHECK (state IN ('reserved', 'reconciled', 'pending_reconciliation', 'expired')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, attempt)
);
CREATE INDEX reservations_open ON reservations (state, created_at) WHERE state <> 'reconciled';

-- Settlement idempotency: a settlement inserts here first and does nothing more when
-- the row already exists.
CREATE TABLE billing_dedup (
    request_id  text PRIMARY KEY,
    api_key_id  bigint NOT NULL,
    fingerprint text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Immutable usage rows: one per billed logical request (attempts listed in `attempts`).
CREATE TABLE usage (
    id          bigserial PRIMARY KEY,
    request_id  text NOT NULL UNIQUE,
    tenant_id   bigint NOT NULL REFERENCES tenants (id),
    api_key_id  bigint NOT NULL REFERENCES api_keys (id),
    group_id    bigint,
    account_id  bigint,
    model       text NOT NULL,
    attempts    integer NOT NULL DEFAULT 1,
    input_tokens        bigint,     -- NULL: unknown, never 0 by default
    output_tokens       bigint,
    cache_read_tokens   bigint,
    cache_write_tokens  bigint,
    reasoning_tokens    bigint,
    cost        numeric(24, 10) NOT NULL DEFAULT 0,
    estimated   boolean NOT NULL DEFAULT false,
    status      integer,
    ttft_ms     double precision,
    total_ms    double precision,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX usage_tenant_time ON usage (tenant_id, created_at);
CREATE INDEX usage_key_time ON usage (api_key_id, created_at);

CREATE FUNCTION tg_usage_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'usage rows are immutable';
END $$;
CREATE TRIGGER usage_immutable BEFORE UPDATE OR DELETE ON usage
    FOR EACH ROW EXECUTE FUNCTION tg_usage_immutable();

-- Every change of a balance: top-ups, usage debits, adjustments.
CREATE TABLE ledger (
    id          bigserial PRIMARY KEY,
    tenant_id   bigint NOT NULL REFERENCES tenants (id),
    kind        text NOT NULL CHECK (kind IN ('opening', 'topup', 'usage', 'adjustment')),
    amount      numeric(24, 10) NOT NULL,
    request_id  text,
    note        text,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_tenant ON ledger (tenant_id, created_at);
