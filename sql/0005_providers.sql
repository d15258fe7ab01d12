-- Provider kinds beyond OpenAI and Anthropic (issue #19): Google Gemini
-- (generateContent, an API key in x-goog-api-key).
ALTER TABLE accounts DROP CONSTRAINT IF EXISTS accounts_provider_check;
ALTER TABLE accounts ADD CONSTRAINT accounts_provider_check
    CHECK (provider IN ('openai', 'anthropic', 'gemini'));
