// GET /v1/models through accounts of every kind beyond OpenAI and Anthropic keys
// (issue #19, item 7): each account's own list read in its provider's shape,
// authenticated as its requests are — Azure OpenAI's /openai/models?api-version with
// api-key or a Microsoft Entra ID token, Bedrock's ListFoundationModels on the control
// plane (and ListInferenceProfiles, paged by nextToken) signed with SigV4 (the mock
// recomputes the signature), Vertex AI's
// publishers.models.list for Anthropic and Google with a service account's token, paged
// by nextPageToken, OAuth refresh-token accounts with their bearer token — merged, and
// answered to the official openai and @anthropic-ai/sdk clients. An upstream that fails
// or answers bytes that are not a list: a 502 in the client's shape naming why, and the
// worker keeps answering. Before the fix these kinds were never asked (an Azure, Bedrock,
// Vertex or identity account contributed only the names it lists or maps: an empty list).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';

import { fetchT, startMock, stopAll } from './lib/harness.mjs';
import { applyState, createDb, plainKey, requireServices, startStateGateway } from './lib/db.mjs';

requireServices();

const EXTRA = Array.from({ length: 12 }, (_, i) => `claude-y-${String(i).padStart(2, '0')}`);
const ANTH_IDS = ['mock-claude', ...EXTRA];
const OA_IDS = ['mock-gpt', 'mock-claude', 'mock-embed', ...EXTRA];
const AKID = 'AKIDEXAMPLE';
const SECRET = 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY';
const EMAIL = 'lister@proj-1.iam.gserviceaccount.com';
// Bedrock: the Anthropic models served on demand, then the Anthropic inference profiles.
const BD_IDS = ANTH_IDS.map((id) => `anthropic.${id}`);
const KINDS = ['az', 'azm', 'bd', 'vx', 'en', 'oo', 'oo2', 'ao', 'broken', 'garbled', 'partial', 'badid'];

let mock, db, gw;
const keys = Object.fromEntries(KINDS.map((k) => [k, plainKey(`k-${k}`)]));

async function mockIdentity(cfg) {
  const r = await fetchT(`${mock.url}/_mock/identity`, cfg ? { method: 'POST', body: JSON.stringify(cfg) } : {});
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}

async function fault(rule) {
  const r = await fetchT(`${mock.url}/_mock/faults`, { method: 'POST', body: JSON.stringify(rule) });
  assert.equal(r.status, 200, await r.clone().text());
}

before(async () => {
  mock = await startMock({ args: ['--models', EXTRA.join(','), '--aws-key', `${AKID}:${SECRET}`] });
  const kp = crypto.generateKeyPairSync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  const sa = JSON.stringify({
    type: 'service_account', project_id: 'proj-1', private_key_id: 'kid-1', private_key: kp.privateKey,
    client_email: EMAIL, client_id: '1', token_uri: `${mock.url}/token`,
  });
  await mockIdentity({
    lifetime_ms: 600000, clients: { 'app-1': 'entra-secret' }, service_accounts: { [EMAIL]: kp.publicKey },
    refresh_tokens: ['rt-oa', 'rt-an'],
  });
  db = await createDb();
  const oauth = { token_url: `${mock.url}/oauth/token`, client_id: 'cli-1' };
  const az = (name, credential, groups, extra = {}) =>
    ({ name, provider: 'azure', base_url: `${mock.url}/openai`, credential, groups, ...extra });
  await applyState(db, {
    tenants: [{ name: 't', balance: '100' }],
    groups: KINDS.map((k) => ({ name: `g-${k}`, models: [] })),
    accounts: [
      az('az', 'az-key', ['g-az']),
      az('azm', 'azm-key', ['g-azm'], { model_map: { 'gpt-4o': 'prod-gpt4o' } }),
      { name: 'bd', provider: 'bedrock', base_url: mock.url, credential: SECRET, groups: ['g-bd', 'g-partial'],
        settings: { region: 'us-east-1', access_key_id: AKID } },
      { name: 'vx', provider: 'vertex', auth: 'service_account', base_url: mock.url, credential: sa, groups: ['g-vx'],
        settings: { project: 'proj-1', region: 'us-east5' } },
      az('en', 'entra-secret', ['g-en'], { auth: 'entra', settings: { tenant_id: 'tenant-1', client_id: 'app-1', authority: mock.url } }),
      { name: 'oo', provider: 'openai', auth: 'oauth', base_url: `${mock.url}/v1`, credential: 'rt-oa', groups: ['g-oo', 'g-oo2'], settings: oauth },
      { name: 'ao', provider: 'anthropic', auth: 'oauth', base_url: `${mock.url}/v1`, credential: 'rt-an', groups: ['g-ao'], settings: oauth },
      // Higher priority than bd in g-partial: its failure leaves bd's list.
      az('broken', 'az-broken', ['g-broken', 'g-partial'], { priority: 10 }),
      az('garbled', 'az-garbled', ['g-garbled']),
      { name: 'badid', provider: 'openai', auth: 'oauth', base_url: `${mock.url}/v1`, credential: 'rt-never-issued',
        groups: ['g-badid'], settings: oauth },
    ],
    keys: KINDS.map((k) => ({ name: `k-${k}`, tenant: 't', group: `g-${k}`, key: keys[k] })),
  });
  gw = await startStateGateway(db, {}, { mock });
  // Google's lists in pages of at most 5 (the gateway follows nextPageToken); the broken
  // account's lists fail, the garbled one's answer is not a list.
  await fault({ credential: '*', page: 5 });
  await fault({ credential: 'az-broken', status: 500 });
  await fault({ credential: 'az-garbled', body: '{"data": "not a list", "object": "list"' });
});

after(async () => {
  await stopAll();
  await db?.drop?.();
});

async function openai(k) {
  const { default: OpenAI } = await import('openai');
  return new OpenAI({ apiKey: keys[k], baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 20000 });
}

async function anthropic(k) {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  return new Anthropic({ apiKey: keys[k], baseURL: gw.url, maxRetries: 0, timeout: 20000 });
}

async function listAll(page) {
  const out = [];
  for await (const m of page) {
    out.push(m);
    assert.ok(out.length < 1000);
  }
  return out;
}

const total = async () => (await mock.stats()).total;

test('Azure OpenAI with api-key: the resource\'s models that can serve (not retired, not tune-only)', async () => {
  const models = await listAll((await openai('az')).models.list());
  assert.deepEqual(models.map((m) => m.id), OA_IDS);
  assert.deepEqual(models[0], { id: 'mock-gpt', object: 'model', created: 1700000000, owned_by: 'azure' });
  const last = await mock.last();
  assert.equal(last.path, '/openai/models?api-version=2024-10-21');
  assert.equal(last.headers['api-key'], 'az-key');
});

test('an Azure account with a model_map lists its deployments\' names, asking nothing', async () => {
  const before = await total();
  const models = await listAll((await openai('azm')).models.list());
  assert.deepEqual(models.map((m) => m.id), ['gpt-4o']);
  assert.equal(await total(), before);
});

test('Bedrock: ListFoundationModels and ListInferenceProfiles (paged) signed with SigV4, the Anthropic models', async () => {
  const before = await total();
  const models = await listAll((await openai('bd')).models.list());
  // amazon.* left out, and the model served only through a profile; the profiles after.
  const want = [...BD_IDS, ...ANTH_IDS.map((id) => `us.anthropic.${id}`)];
  assert.deepEqual(models.map((m) => m.id), want);
  assert.equal(models[0].owned_by, 'bedrock');
  assert.equal(await total() - before, 1 + 3, 'the models, then three pages of profiles (14 in pages of 5)');
  const last = await mock.last();
  assert.equal(last.method, 'GET');
  assert.match(last.path, /^\/(foundation-models|inference-profiles\?maxResults=1000&nextToken=pt%2F10%3D)$/);
  assert.match(last.headers.authorization,
    /^AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE\/\d{8}\/us-east-1\/bedrock\/aws4_request, SignedHeaders=host;x-amz-date, Signature=[0-9a-f]{64}$/);
  // The Anthropic client: the same list, in its shape.
  const an = await listAll((await anthropic('bd')).models.list({ limit: 4 }));
  assert.deepEqual(an.map((m) => m.id), want);
  assert.deepEqual(an[0], { type: 'model', id: 'anthropic.mock-claude', display_name: 'mock-claude', created_at: '1970-01-01T00:00:00Z' });
});

test('Vertex AI: both publishers\' lists with the service account\'s token, followed page by page', async () => {
  const before = await total();
  const tokensBefore = (await mockIdentity()).by_grant.jwt_bearer ?? 0;
  const models = await listAll((await openai('vx')).models.list());
  // Anthropic's publisher first (13 models, pages of 5), then Google's Gemini models (16,
  // imagen-mock left out: it takes predict, not generateContent).
  assert.deepEqual(models.map((m) => m.id), [...ANTH_IDS, ...OA_IDS.map((id) => `gemini-${id}`)]);
  assert.equal(models[0].owned_by, 'vertex');
  assert.equal(await total() - before, 3 + 4, 'three pages from anthropic, four from google');
  const last = await mock.last();
  assert.match(last.path, /^\/v1beta1\/publishers\/(anthropic\/models\?pageSize=1000&pageToken=pt%2F10%3D|google\/models\?pageSize=1000&pageToken=pt%2F15%3D)$/);
  assert.match(last.headers.authorization, /^Bearer mt-/);
  assert.equal((await mockIdentity()).by_grant.jwt_bearer - tokensBefore, 1, 'one token for all seven pages');
  // The Anthropic client pages the merged list across the upstream's page boundary.
  const page = await (await fetchT(`${gw.url}/v1/models?limit=3&after_id=claude-y-02`, {
    headers: { 'x-api-key': keys.vx, 'anthropic-version': '2023-06-01' },
  })).json();
  assert.deepEqual(page.data.map((m) => m.id), ['claude-y-03', 'claude-y-04', 'claude-y-05']);
  assert.equal(page.has_more, true);
  const an = await listAll((await anthropic('vx')).models.list({ limit: 4 }));
  assert.equal(an.length, ANTH_IDS.length + OA_IDS.length);
});

test('Azure with a Microsoft Entra ID app: the list asked with its bearer token', async () => {
  const models = await listAll((await openai('en')).models.list());
  assert.deepEqual(models.map((m) => m.id), OA_IDS);
  const last = await mock.last();
  assert.equal(last.path, '/openai/models?api-version=2024-10-21');
  assert.match(last.headers.authorization, /^Bearer mt-/);
  assert.equal(last.headers['api-key'], undefined);
});

test('OAuth refresh-token accounts (OpenAI and Anthropic): their lists with the access token', async () => {
  const oa = await listAll((await openai('oo')).models.list());
  assert.deepEqual(oa.map((m) => m.id), OA_IDS);
  assert.match((await mock.last()).headers.authorization, /^Bearer mt-/);
  const before = await total();
  const an = await listAll((await anthropic('ao')).models.list({ limit: 50 }));
  assert.deepEqual(an.map((m) => m.id), ANTH_IDS);
  assert.deepEqual(an[1], { type: 'model', id: 'claude-y-00', display_name: 'claude-y-00', created_at: '2023-11-14T22:13:20Z' });
  assert.equal(await total() - before, 3, "Anthropic's pages of 5: 13 models in three");
  const last = await mock.last();
  assert.match(last.headers.authorization, /^Bearer mt-/);
  assert.equal(last.headers['anthropic-version'], '2023-06-01');
  assert.equal(last.headers['x-api-key'], undefined);
  assert.equal((await mockIdentity()).by_grant.refresh_token, 2, 'one refresh per account');
});

test('an upstream that fails: 502 in the client\'s shape saying why; the worker keeps answering', async () => {
  await assert.rejects((await openai('broken')).models.list(), (e) => {
    assert.equal(e.status, 502);
    assert.match(e.message, /no upstream account of this key.s group could list its models \(the upstream answered HTTP 500\)/);
    return true;
  });
  const r = await fetchT(`${gw.url}/v1/models`, { headers: { 'x-api-key': keys.broken, 'anthropic-version': '2023-06-01' } });
  assert.equal(r.status, 502);
  const body = await r.json();
  assert.equal(body.type, 'error');
  assert.match(body.error.message, /HTTP 500/);
  await assert.rejects((await anthropic('broken')).models.list(), (e) => e.status === 502);
  // Bytes that are not a list.
  await assert.rejects((await openai('garbled')).models.list(),
    (e) => e.status === 502 && /the upstream's list could not be read/.test(e.message));
  // An identity whose token cannot be obtained: the OAuth error named.
  await assert.rejects((await openai('badid')).models.list(),
    (e) => e.status === 502 && /its credentials could not be renewed \(invalid_grant\)/.test(e.message));
  // One of two failing: the other's list.
  const part = await listAll((await openai('partial')).models.list());
  assert.deepEqual(part.map((m) => m.id), [...BD_IDS, ...ANTH_IDS.map((id) => `us.anthropic.${id}`)]);
  // Still serving.
  const az = await listAll((await openai('az')).models.list());
  assert.equal(az.length, OA_IDS.length);
});

test('a token the upstream no longer takes: one renewal, the list asked once more (last: it resets the mock)', async () => {
  await listAll((await openai('oo')).models.list()); // the account holds a token (cached list)
  // The issuer forgets every token it gave out; the refresh token is live again.
  await mock.reset();
  await mockIdentity({ lifetime_ms: 600000, refresh_tokens: ['rt-oa'] });
  // Another group with the same account: not cached, asked with the forgotten token.
  const models = await listAll((await openai('oo2')).models.list());
  assert.deepEqual(models.map((m) => m.id), OA_IDS);
  const id = await mockIdentity();
  assert.equal(id.unknown_presented, 1, 'the old token refused once');
  assert.equal(id.by_grant.refresh_token, 1, 'renewed once');
  assert.equal((await mock.stats()).total, 2, 'the 401, then the list');
  assert.match((await mock.last()).headers.authorization, /^Bearer mt-/);
});
