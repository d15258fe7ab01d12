-- Provider kinds (issue #19): Azure OpenAI, and each account's provider settings
-- (an object of strings: azure's api_version, ...). An Azure account's model_map maps
-- the client's model names to its deployments.
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS settings jsonb NOT NULL DEFAULT '{}'::jsonb;
ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_provider_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_provider_check
    CHECK (provider IN ('openai', 'anthropic', 'gemini', 'azure'));
