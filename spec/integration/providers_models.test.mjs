// GET /v1/models for a key whose group offers every model its accounts serve (issue #19,
// item 7): each account's list is read in its provider's own shape (Anthropic's followed
// page by page), the group's lists are merged, cached briefly, and answered in the
// client's shape — the official openai and @anthropic-ai/sdk clients list them. Before
// the fix an OpenAI client with an Anthropic account got 502 "the upstream's answer
// could not be read".
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { fetchT, startMock, stopAll } from './lib/harness.mjs';
import { applyState, createDb, plainKey, requireServices, startStateGateway } from './lib/db.mjs';

requireServices();

// Thirty extra names, so that Anthropic's pages (the mock's `page` knob) are many.
const EXTRA = Array.from({ length: 30 }, (_, i) => `claude-x-${String(i).padStart(2, '0')}`);
const ANTH_IDS = ['mock-claude', ...EXTRA]; // what the mock lists in Anthropic's shape
const OA_IDS = ['mock-gpt', 'mock-claude', 'mock-embed', ...EXTRA]; // in OpenAI's

let mock, db, gw;
const keys = {
  anth: plainKey('anth'), mixed: plainKey('mixed'), listed: plainKey('listed'), narrow: plainKey('narrow'),
  garbled: plainKey('garbled'),
};

before(async () => {
  mock = await startMock({ args: ['--models', EXTRA.join(',')] });
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 't', balance: '100' }],
    groups: [
      { name: 'anth-only', models: [] },
      { name: 'mixed', models: [] },
      { name: 'listed', models: ['model-a', 'model-b'] },
      { name: 'garbled', models: [] },
    ],
    accounts: [
      { name: 'an', provider: 'anthropic', base_url: `${mock.url}/v1`, credential: 'sk-an', groups: ['anth-only', 'mixed'] },
      // Higher priority: its list comes first in the merge.
      { name: 'oa', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-oa', priority: 10, groups: ['mixed'],
        model_map: { 'my-alias': 'mock-gpt' } },
      { name: 'gb', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-garbled', groups: ['garbled'] },
    ],
    keys: [
      { name: 'k-anth', tenant: 't', group: 'anth-only', key: keys.anth },
      { name: 'k-mixed', tenant: 't', group: 'mixed', key: keys.mixed },
      { name: 'k-listed', tenant: 't', group: 'listed', key: keys.listed },
      { name: 'k-narrow', tenant: 't', group: 'mixed', key: keys.narrow, allowed_models: ['mock-claude', 'claude-x-07'] },
      { name: 'k-garbled', tenant: 't', group: 'garbled', key: keys.garbled },
    ],
  });
  gw = await startStateGateway(db, {}, { mock });
  // Anthropic's pages of at most 7: the gateway must follow has_more / last_id.
  const r = await fetchT(`${mock.url}/_mock/faults`, {
    method: 'POST',
    body: JSON.stringify({ credential: 'sk-an', page: 7 }),
  });
  assert.equal(r.status, 200);
});

after(async () => {
  await stopAll();
  await db?.drop?.();
});

async function openai(key) {
  const { default: OpenAI } = await import('openai');
  return new OpenAI({ apiKey: key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 20000 });
}

async function anthropic(key) {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  return new Anthropic({ apiKey: key, baseURL: gw.url, maxRetries: 0, timeout: 20000 });
}

async function listAll(page) {
  const out = [];
  for await (const m of page) {
    out.push(m);
    assert.ok(out.length < 1000);
  }
  return out;
}

const upstreamModelCalls = async (cred) => (await mock.stats()).credentials[cred]?.requests ?? 0;

test('an OpenAI client lists the models of a group with only an Anthropic account', async () => {
  const before = await upstreamModelCalls('sk-an');
  const models = await listAll((await openai(keys.anth)).models.list());
  assert.deepEqual(models.map((m) => m.id), ANTH_IDS);
  for (const m of models) {
    assert.equal(m.object, 'model');
    assert.equal(m.created, 1700000000, 'created_at 2023-11-14T22:13:20Z as seconds');
    assert.equal(m.owned_by, 'anthropic');
  }
  // 31 models in pages of 7: five requests, each with anthropic's headers and cursor.
  assert.equal((await upstreamModelCalls('sk-an')) - before, 5);
  const last = await mock.last();
  assert.equal(last.headers['x-api-key'], 'sk-an');
  assert.equal(last.headers['anthropic-version'], '2023-06-01');
  assert.match(last.path, /^\/v1\/models\?limit=1000&after_id=claude-x-/);
});

test('the list is cached: a second listing asks no upstream', async () => {
  const before = await upstreamModelCalls('sk-an');
  const models = await listAll((await openai(keys.anth)).models.list());
  assert.equal(models.length, ANTH_IDS.length);
  assert.equal(await upstreamModelCalls('sk-an'), before);
});

test("a mixed group's lists are merged, first by priority, each id once, mapped names added", async () => {
  const models = await listAll((await openai(keys.mixed)).models.list());
  const ids = models.map((m) => m.id);
  assert.deepEqual(ids, [...OA_IDS, 'my-alias']);
  // An entry read in OpenAI's shape goes back as the provider wrote it.
  assert.deepEqual(models[0], { id: 'mock-gpt', object: 'model', created: 1700000000, owned_by: 'tollgate-mock' });
});

test('an Anthropic client gets Anthropic pages over the merged list', async () => {
  const client = await anthropic(keys.mixed);
  const all = await listAll(client.models.list({ limit: 10 }));
  assert.deepEqual(all.map((m) => m.id), [...OA_IDS, 'my-alias']);
  const gpt = all.find((m) => m.id === 'mock-gpt');
  assert.deepEqual(gpt, { type: 'model', id: 'mock-gpt', display_name: 'mock-gpt', created_at: '2023-11-14T22:13:20Z' });
  // One page by hand: the shape on the wire.
  const r = await fetchT(`${gw.url}/v1/models?limit=3&after_id=mock-embed`, {
    headers: { 'x-api-key': keys.mixed, 'anthropic-version': '2023-06-01' },
  });
  assert.equal(r.status, 200);
  const page = await r.json();
  assert.deepEqual(page.data.map((m) => m.id), ['claude-x-00', 'claude-x-01', 'claude-x-02']);
  assert.equal(page.has_more, true);
  assert.equal(page.first_id, 'claude-x-00');
  assert.equal(page.last_id, 'claude-x-02');
  const back = await (await fetchT(`${gw.url}/v1/models?limit=2&before_id=claude-x-00`, {
    headers: { 'x-api-key': keys.mixed, 'anthropic-version': '2023-06-01' },
  })).json();
  assert.deepEqual(back.data.map((m) => m.id), ['mock-claude', 'mock-embed']);
  assert.equal(back.has_more, true);
  // A bad limit: Anthropic's error shape.
  const bad = await fetchT(`${gw.url}/v1/models?limit=0`, {
    headers: { 'x-api-key': keys.mixed, 'anthropic-version': '2023-06-01' },
  });
  assert.equal(bad.status, 400);
  const err = await bad.json();
  assert.equal(err.type, 'error');
  assert.equal(err.error.type, 'invalid_request_error');
});

test("the key's model restrictions apply to the merged list", async () => {
  const models = await listAll((await openai(keys.narrow)).models.list());
  assert.deepEqual(models.map((m) => m.id), ['mock-claude', 'claude-x-07']);
});

test('a group that lists its models answers that list, in either shape', async () => {
  const oa = await listAll((await openai(keys.listed)).models.list());
  assert.deepEqual(oa.map((m) => m.id), ['model-a', 'model-b']);
  const an = await listAll((await anthropic(keys.listed)).models.list());
  assert.deepEqual(an.map((m) => [m.type, m.id]), [['model', 'model-a'], ['model', 'model-b']]);
});

test('a list that is not JSON: 502 saying so, and the worker keeps answering (it crashed before)', async () => {
  const r = await fetchT(`${mock.url}/_mock/faults`, {
    method: 'POST',
    body: JSON.stringify({ credential: 'sk-garbled', body: '{"object":"list","data":[{"id":"cut' }),
  });
  assert.equal(r.status, 200);
  for (let i = 0; i < 3; i++) {
    await assert.rejects((await openai(keys.garbled)).models.list(),
      (e) => e.status === 502 && /the upstream's list could not be read/.test(e.message));
  }
  const models = await listAll((await openai(keys.listed)).models.list());
  assert.equal(models.length, 2);
});
