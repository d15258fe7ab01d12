// Identities that expire (issue #19, items 2, 4, 5): an Azure OpenAI account with a
// Microsoft Entra ID app (client credentials), a Vertex AI account with a service
// account key (an RS256 JWT the mock verifies with the key's public half) serving a
// Claude model through rawPredict / streamRawPredict and a Gemini model through
// generateContent, and an OAuth refresh-token account. The official clients against
// them, what the upstream received, the usage billed, one token request per token, a
// 401 answered by one refresh and one retry, a refresh refused with invalid_grant
// (marked, cooled, on /metrics), and the admin API's 400s for a bad key.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';

import { fetchT, mockInputTokens, mockText, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { billedSetup, startBilledGateway, waitUsageRow } from './lib/billing.mjs';
import { adminClient, applyState, metrics } from './lib/db.mjs';

const CLAUDE = 'claude-sonnet-4@20250514';
const GEMINI = 'gemini-2.0-flash';
const EMAIL = 'gateway@proj-1.iam.gserviceaccount.com';
let mock, bill, gw, sa, pub;

async function mockIdentity(cfg) {
  const r = await fetchT(`${mock.url}/_mock/identity`, cfg ? { method: 'POST', body: JSON.stringify(cfg) } : {});
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}

function saKey(privateKey, extra = {}) {
  return JSON.stringify({
    type: 'service_account', project_id: 'proj-1', private_key_id: 'kid-1', private_key: privateKey,
    client_email: EMAIL, client_id: '1234', token_uri: `${mock.url}/token`, ...extra,
  }, null, 2);
}

before(async () => {
  mock = await startMock();
  const kp = crypto.generateKeyPairSync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  pub = kp.publicKey;
  sa = saKey(kp.privateKey);
  await mockIdentity({ lifetime_ms: 600000, clients: { 'app-1': 'entra-secret-1' }, service_accounts: { [EMAIL]: pub } });
  bill = await billedSetup({
    mock,
    prices: [
      { model: 'gpt-4o', input: '1.00', output: '2.00' },
      { model: CLAUDE, input: '3.00', output: '15.00' },
      { model: GEMINI, input: '1.00', output: '2.00' },
      { model: 'oauth-model', input: '1.00', output: '2.00' },
    ],
    accounts: [
      {
        name: 'up', provider: 'azure', auth: 'entra', base_url: `${mock.url}/openai`, credential: 'entra-secret-1',
        models: ['gpt-4o'], model_map: { 'gpt-4o': 'prod-gpt4o' },
        settings: { tenant_id: 'tenant-1', client_id: 'app-1', authority: mock.url },
      },
      {
        name: 'vx', provider: 'vertex', auth: 'service_account', base_url: mock.url, credential: sa,
        models: [CLAUDE, GEMINI], settings: { project: 'proj-1', region: 'us-east5' },
      },
      {
        name: 'oa', provider: 'openai', auth: 'oauth', base_url: `${mock.url}/v1`, credential: 'rt-never-issued',
        models: ['oauth-model'], settings: { token_url: `${mock.url}/oauth/token`, client_id: 'cli-1' },
      },
    ],
  });
  gw = await startBilledGateway(bill, { routing: { cooldown_auth_ms: 60000 } }, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

async function openai() {
  const { default: OpenAI } = await import('openai');
  return new OpenAI({ apiKey: bill.key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 30000 });
}

async function anthropic() {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  return new Anthropic({ apiKey: bill.key, baseURL: gw.url, maxRetries: 0, timeout: 30000 });
}

test('Azure OpenAI with a Microsoft Entra ID app: a bearer token from client credentials, one token request', async () => {
  const client = await openai();
  const text = 'hello entra [mock chunks=4]';
  const r = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: text }] }).withResponse();
  assert.equal(r.data.choices[0].message.content, mockText(4));
  let last = await mock.last();
  assert.equal(last.path, '/openai/deployments/prod-gpt4o/chat/completions?api-version=2024-10-21');
  assert.match(last.headers.authorization, /^Bearer mt-/, 'the Entra token, not a key');
  assert.equal(last.headers['api-key'], undefined);
  const row = await waitUsageRow(bill, r.response.headers.get('x-request-id'));
  const inTok = mockInputTokens({ messages: [{ content: text }] });
  assert.equal(Number(row.input_tokens), inTok);
  assert.equal(Number(row.output_tokens), 4);
  assert.equal(row.cost, BigInt(inTok) * 1000n + 4n * 2000n);

  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: text }], stream: true });
  let got = '';
  for await (const ch of stream) got += ch.choices[0]?.delta?.content ?? '';
  assert.equal(got, mockText(4));
  last = await mock.last();
  assert.match(last.headers.authorization, /^Bearer mt-/);
  const id = await mockIdentity();
  assert.equal(id.by_grant.client_credentials, 1, 'one token for both requests (and both workers share it)');
  const [acc] = await bill.db.query(`SELECT token_expires_at > now() + interval '8 minutes' AS later,
    token_refreshed_at IS NOT NULL AS refreshed, access_token IS NOT NULL AS stored,
    position('mt-' in encode(access_token, 'escape')) = 0 AS sealed FROM accounts WHERE name = 'up'`);
  assert.deepEqual(acc, { later: true, refreshed: true, stored: true, sealed: true });
});

test('Claude on Vertex AI (@anthropic-ai/sdk): rawPredict and streamRawPredict with a service account token, billed', async () => {
  const client = await anthropic();
  const text = 'hello vertex [mock chunks=5]';
  const r = await client.messages.create({ model: CLAUDE, max_tokens: 64, messages: [{ role: 'user', content: text }] }).withResponse();
  assert.equal(r.data.content[0].text, mockText(5));
  assert.equal(r.data.usage.output_tokens, 5);
  let last = await mock.last();
  assert.equal(last.path, `/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/${CLAUDE}:rawPredict`);
  assert.match(last.headers.authorization, /^Bearer mt-/);
  let body = JSON.parse(last.body);
  assert.equal(body.anthropic_version, 'vertex-2023-10-16');
  assert.equal(body.model, undefined, 'the model is in the URL');
  assert.equal(last.headers['anthropic-version'], undefined);
  const row = await waitUsageRow(bill, r.response.headers.get('x-request-id'));
  const inTok = mockInputTokens({ messages: [{ content: text }] });
  assert.equal(Number(row.input_tokens), inTok);
  assert.equal(Number(row.output_tokens), 5);
  assert.equal(row.cost, BigInt(inTok) * 3000n + 5n * 15000n);

  const stream = client.messages.stream({ model: CLAUDE, max_tokens: 64, messages: [{ role: 'user', content: text }] });
  let got = '';
  for await (const ev of stream) if (ev.type === 'content_block_delta') got += ev.delta.text;
  const fin = await stream.finalMessage();
  assert.equal(got, mockText(5));
  assert.equal(fin.usage.output_tokens, 5);
  last = await mock.last();
  assert.equal(last.path, `/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/${CLAUDE}:streamRawPredict`);
  body = JSON.parse(last.body);
  assert.equal(body.stream, true);
  assert.equal(body.anthropic_version, 'vertex-2023-10-16');
  const id = await mockIdentity();
  assert.equal(id.by_grant.jwt_bearer, 1, 'one signed assertion, verified by the mock with the public key');
});

test('an OpenAI client to Claude on Vertex is translated; Gemini on Vertex goes to generateContent', async () => {
  const client = await openai();
  const c = await client.chat.completions.create({ model: CLAUDE, messages: [{ role: 'user', content: 'x [mock chunks=2]' }] });
  assert.equal(c.choices[0].message.content, mockText(2));
  assert.equal(JSON.parse((await mock.last()).body).anthropic_version, 'vertex-2023-10-16');
  const g = await client.chat.completions.create({ model: GEMINI, messages: [{ role: 'user', content: 'y [mock chunks=3]' }] });
  assert.equal(g.choices[0].message.content, mockText(3));
  const last = await mock.last();
  assert.equal(last.path, `/v1/projects/proj-1/locations/us-east5/publishers/google/models/${GEMINI}:generateContent`);
  assert.match(last.headers.authorization, /^Bearer mt-/);
  const stream = await client.chat.completions.create({ model: GEMINI, messages: [{ role: 'user', content: 'y [mock chunks=3]' }], stream: true });
  let got = '';
  for await (const ch of stream) got += ch.choices[0]?.delta?.content ?? '';
  assert.equal(got, mockText(3));
  assert.equal((await mock.last()).path,
    `/v1/projects/proj-1/locations/us-east5/publishers/google/models/${GEMINI}:streamGenerateContent?alt=sse`);
  assert.equal((await mockIdentity()).by_grant.jwt_bearer, 1, 'the same token');
});

test('a 401 to a token the upstream no longer takes: one refresh, one retry on the same account', async () => {
  // The issuer forgets every token it gave out (the upstream answers 401 to them).
  await mock.reset();
  await mockIdentity({ lifetime_ms: 600000, clients: { 'app-1': 'entra-secret-1' }, service_accounts: { [EMAIL]: pub } });
  const client = await anthropic();
  for (let i = 0; i < 3; i++) {
    const m = await client.messages.create({ model: CLAUDE, max_tokens: 16, messages: [{ role: 'user', content: 'again [mock chunks=2]' }] });
    assert.equal(m.content[0].text, mockText(2));
  }
  const id = await mockIdentity();
  assert.ok(id.unknown_presented >= 1 && id.unknown_presented <= 2, `the old token refused (${id.unknown_presented}: once per worker at most)`);
  assert.ok(id.by_grant.jwt_bearer >= 1 && id.by_grant.jwt_bearer <= 2, `renewed (${id.by_grant.jwt_bearer})`);
  const st = await mock.stats();
  assert.equal(st.total, 3 + id.unknown_presented, 'each 401 retried once, nothing else');
});

test('a refresh refused with invalid_grant: the account is marked, cooled and on /metrics', async () => {
  const client = await openai();
  await assert.rejects(
    client.chat.completions.create({ model: 'oauth-model', messages: [{ role: 'user', content: 'z' }] }),
    (e) => e.status === 502 && /could not be renewed \(invalid_grant\)/.test(e.message),
  );
  const [acc] = await bill.db.query(`SELECT auth_error, cooldown_until > now() + interval '30 seconds' AS cooled
    FROM accounts WHERE name = 'oa'`);
  assert.deepEqual(acc, { auth_error: 'invalid_grant', cooled: true });
  const [{ id }] = await bill.db.query(`SELECT id FROM accounts WHERE name = 'oa'`);
  await waitFor(async () => (await metrics(gw))[`tollgate_account_auth_error{account="${id}",reason="invalid_grant"}`] === 1,
    { timeout: 5000, what: 'the failed refresh on /metrics' });
  const m = await metrics(gw);
  assert.ok(m['tollgate_identity_refreshes_total{result="failed"}'] >= 1);
  // Cooled: the next request is refused without another token request.
  const before = (await mockIdentity()).by_grant.refresh_token;
  const r = await fetchT(`${gw.url}/v1/chat/completions`, {
    method: 'POST', headers: { authorization: `Bearer ${bill.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'oauth-model', messages: [{ role: 'user', content: 'z' }] }),
  });
  assert.equal(r.status, 503, await r.text());
  assert.equal((await mockIdentity()).by_grant.refresh_token, before);
  // The console reads it from the admin API.
  const admin = adminClient(gw);
  const got = await admin.read(`/accounts/${id}`);
  assert.equal(got.auth_error, 'invalid_grant');
  assert.equal(got.auth, 'oauth');
  assert.equal(got.credential, undefined, 'never shown');
});

test('a bad service account key or identity gets the admin API 400 naming it', async () => {
  const admin = adminClient(gw);
  const base = { name: 'bad', provider: 'vertex', auth: 'service_account', base_url: mock.url, settings: { project: 'p', region: 'us-east5' } };
  const cases = [
    [{ ...base, credential: '{"type": "service_account", "private_key": ' }, /credential.*not a JSON object/],
    [{ ...base, credential: saKey('-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n') }, /not an RSA private key in PEM/],
    [{ ...base, credential: JSON.stringify({ type: 'authorized_user', refresh_token: 'x' }) }, /not "service_account"/],
    [{ ...base, credential: saKey(crypto.generateKeyPairSync('ec', { namedCurve: 'P-256', privateKeyEncoding: { type: 'pkcs8', format: 'pem' }, publicKeyEncoding: { type: 'spki', format: 'pem' } }).privateKey) }, /not an RSA private key/],
    [{ ...base, auth: 'key', credential: 'k' }, /vertex account authenticates with a service account/],
    [{ ...base, settings: {}, credential: sa }, /settings.project and settings.region/],
    [{ name: 'bad', provider: 'openai', auth: 'entra', base_url: mock.url, credential: 's' }, /entra.*is for azure/],
    [{ name: 'bad', provider: 'azure', auth: 'entra', base_url: mock.url, credential: 's', settings: { tenant_id: 't' } }, /settings.tenant_id and settings.client_id/],
  ];
  for (const [body, re] of cases) {
    const r = await admin.post('/accounts', body);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, re);
  }
  const ok = await admin.post('/accounts', { ...base, name: 'good', credential: sa });
  assert.equal(ok.status, 201, ok.text);
  assert.equal(ok.json.credential, undefined);
});

test('the console\'s account test goes through the identity: an Entra token, a service account token', async () => {
  const admin = adminClient(gw);
  for (const [name, path] of [['up', /^\/deployments\/prod-gpt4o\/chat\/completions/], ['vx', new RegExp(`publishers/anthropic/models/${CLAUDE}:rawPredict$`)]]) {
    const [{ id }] = await bill.db.query(`SELECT id FROM accounts WHERE name = '${name}'`);
    const r = await admin.post(`/accounts/${id}/test`, {});
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.ok, true, r.text);
    assert.match(r.json.path, path);
    assert.match((await mock.last()).headers.authorization, /^Bearer mt-/);
  }
});

test('tollgate apply refuses a bad service account key with the admin API\'s message', async () => {
  await assert.rejects(
    applyState(bill.db, {
      accounts: [{
        name: 'bad-apply', provider: 'vertex', auth: 'service_account', base_url: mock.url,
        credential: saKey('-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n'), settings: { project: 'p', region: 'r' },
      }],
    }),
    /not an RSA private key in PEM/,
  );
  await assert.rejects(
    applyState(bill.db, { accounts: [{ name: 'bad-apply', provider: 'vertex', base_url: mock.url, credential: 'k', settings: { project: 'p', region: 'r' } }] }),
    /vertex account authenticates with a service account key/,
  );
});
