-- Identities that expire (issue #19): an account's credential is an API key ('key'),
-- or what the gateway exchanges for an access token that it refreshes before it expires:
-- a Microsoft Entra ID app's client secret ('entra', client credentials; the tenant and
-- client id in settings), a Google service account's JSON key ('service_account', an
-- RS256-signed JWT for Vertex AI), or an OAuth refresh token ('oauth', the refresh_token
-- grant; token_url and client_id in settings). The gateway owns the columns below: the
-- access token and the latest refresh token (a server may rotate it), both sealed like
-- the credential, their expiry, the last refresh and, when a refresh failed, why.
ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_provider_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_provider_check
    CHECK (provider IN ('openai', 'anthropic', 'gemini', 'azure', 'bedrock', 'vertex'));
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS auth text NOT NULL DEFAULT 'key'
    CHECK (auth IN ('key', 'entra', 'service_account', 'oauth'));
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS access_token bytea;
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS refresh_token bytea;
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS token_expires_at timestamptz;
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS token_refreshed_at timestamptz;
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS auth_error text;
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS auth_error_at timestamptz;

-- A new credential or another kind of identity: what the gateway derived from the old
-- one is dropped (the operator's new refresh token wins over a rotated old one). New
-- settings (another tenant, token URL, ...) drop the access token only: a rotated
-- refresh token stays the one to use.
CREATE OR REPLACE FUNCTION tg_accounts_identity_reset() RETURNS trigger AS $$
BEGIN
    IF NEW.credential IS DISTINCT FROM OLD.credential OR NEW.auth IS DISTINCT FROM OLD.auth THEN
        NEW.refresh_token := NULL;
    END IF;
    IF NEW.credential IS DISTINCT FROM OLD.credential OR NEW.auth IS DISTINCT FROM OLD.auth
       OR NEW.settings IS DISTINCT FROM OLD.settings THEN
        NEW.access_token := NULL;
        NEW.token_expires_at := NULL;
        NEW.auth_error := NULL;
        NEW.auth_error_at := NULL;
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS accounts_identity_reset ON accounts;
CREATE TRIGGER accounts_identity_reset BEFORE UPDATE OF credential, auth, settings ON accounts
    FOR EACH ROW EXECUTE FUNCTION tg_accounts_identity_reset();
