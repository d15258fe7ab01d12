// Tenant isolation on the data plane: tenant A's key can neither use tenant B's
// group's models (403) nor spend through B's upstream account. Every request of A
// reaches the upstream with A's account credential only (the mock counts requests per
// credential), the client's own key never goes upstream, and A sees only its models.
// Billing is on (the default): A's usage is charged to A's balance only.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startMock, stopAll, waitFor } from './lib/harness.mjs';
import { adminClient, applyState, chat, chatReq, createDb, plainKey, request, startStateGateway } from './lib/db.mjs';

const KEY_A = plainKey('tenant-a');
const KEY_B = plainKey('tenant-b');
const KEY_A2 = plainKey('tenant-a-narrow');
const KEY_OFFICE = plainKey('office');
const KEY_LOCAL = plainKey('local');
const CRED_A = 'sk-account-of-tenant-a';
const CRED_B = 'sk-account-of-tenant-b';
let db;
let mock;
let gw;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'tenant-a', balance: '10' }, { name: 'tenant-b', balance: '10' }],
    groups: [{ name: 'group-a', models: ['model-a', 'model-shared'] }, { name: 'group-b', models: ['model-b', 'model-shared'] }],
    accounts: [
      { name: 'acct-a', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED_A, concurrency: 100, groups: ['group-a'] },
      { name: 'acct-b', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED_B, concurrency: 100, groups: ['group-b'] },
    ],
    prices: ['model-a', 'model-b', 'model-shared'].map((model) => ({ model, input: '1.00', output: '2.00' })),
    keys: [
      { name: 'a', tenant: 'tenant-a', group: 'group-a', key: KEY_A },
      { name: 'b', tenant: 'tenant-b', group: 'group-b', key: KEY_B },
      { name: 'a-narrow', tenant: 'tenant-a', group: 'group-a', key: KEY_A2, allowed_models: ['model-shared'] },
      { name: 'a-office', tenant: 'tenant-a', group: 'group-a', key: KEY_OFFICE, ip_allow: ['10.0.0.0/8', '192.168.1.0/24'] },
      { name: 'a-local', tenant: 'tenant-a', group: 'group-a', key: KEY_LOCAL, ip_allow: ['127.0.0.1/32'] },
    ],
  });
  gw = await startStateGateway(db, {}, { mock, billing: true });
});

after(async () => {
  await stopAll();
  await db?.drop();
});

const credStats = async () => {
  const c = (await mock.stats()).credentials;
  return { a: c[CRED_A]?.requests ?? 0, b: c[CRED_B]?.requests ?? 0, total: Object.values(c).reduce((n, x) => n + x.requests, 0) };
};

test("tenant A's key gets 403 for tenant B's models, and nothing reaches any upstream", async () => {
  await mock.reset();
  for (const [key, model] of [[KEY_A, 'model-b'], [KEY_B, 'model-a'], [KEY_A2, 'model-a'], [KEY_A, 'gpt-4o']]) {
    const r = await chat(gw, key, chatReq(model));
    assert.equal(r.status, 403, `${model}: ${r.text}`);
    assert.equal(r.json?.error?.code, 'model_not_allowed');
    assert.equal(r.json?.error?.type, 'permission_error');
  }
  const streamed = await chat(gw, KEY_A, chatReq('model-b', 'hi', { stream: true }));
  assert.equal(streamed.status, 403);
  assert.deepEqual(await credStats(), { a: 0, b: 0, total: 0 });
});

test("A's requests reach only A's account credential, B's only B's", async () => {
  await mock.reset();
  for (let i = 0; i < 6; i++) {
    const ra = await chat(gw, KEY_A, chatReq(i % 2 ? 'model-a' : 'model-shared', `a ${i} [mock chunks=2]`));
    assert.equal(ra.status, 200, ra.text);
    const last = await mock.last();
    assert.equal(last.headers.authorization, `Bearer ${CRED_A}`);
    assert.ok(!JSON.stringify(last).includes(KEY_A), "A's own key is never sent upstream");
  }
  for (let i = 0; i < 4; i++) {
    const rb = await chat(gw, KEY_B, chatReq('model-shared', `b ${i}`));
    assert.equal(rb.status, 200, rb.text);
    assert.equal((await mock.last()).headers.authorization, `Bearer ${CRED_B}`);
  }
  const narrow = await chat(gw, KEY_A2, chatReq('model-shared'));
  assert.equal(narrow.status, 200, narrow.text);
  assert.deepEqual(await credStats(), { a: 7, b: 4, total: 11 });
});

test('concurrent traffic of both tenants never crosses accounts', async () => {
  await mock.reset();
  const jobs = [];
  for (let i = 0; i < 40; i++) {
    jobs.push(chat(gw, i % 2 ? KEY_A : KEY_B, chatReq(i % 2 ? 'model-a' : 'model-b', `mix ${i} [mock chunks=3 interval_ms=5]`, { stream: true })));
  }
  const rs = await Promise.all(jobs);
  assert.ok(rs.every((r) => r.status === 200), rs.map((r) => r.status).join(','));
  assert.deepEqual(await credStats(), { a: 20, b: 20, total: 40 });
});

test("each tenant's key lists only its own group's models", async () => {
  const list = async (key) => {
    const r = await request(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
    assert.equal(r.status, 200, r.text);
    return r.json.data.map((m) => m.id).sort();
  };
  assert.deepEqual(await list(KEY_A), ['model-a', 'model-shared']);
  assert.deepEqual(await list(KEY_B), ['model-b', 'model-shared']);
  assert.deepEqual(await list(KEY_A2), ['model-shared']);
});

test("suspending tenant B stops B's keys and leaves A's untouched", async () => {
  const admin = adminClient(gw);
  const b = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'tenant-b'"));
  assert.equal((await admin.patch(`/tenants/${b}`, { status: 'suspended' })).status, 200);
  // Every worker drops its cached key within milliseconds (Redis Pub/Sub).
  await waitFor(async () => (await chat(gw, KEY_B, chatReq('model-b'))).status === 401, { timeout: 1000, interval: 20, what: "B's key refused" });
  for (let i = 0; i < 6; i++) assert.equal((await chat(gw, KEY_B, chatReq('model-b'))).status, 401);
  const ra = await chat(gw, KEY_A, chatReq('model-a'));
  assert.equal(ra.status, 200, ra.text);
  assert.equal((await admin.patch(`/tenants/${b}`, { status: 'active' })).status, 200);
});

test("a client key is not an admin token: A cannot read B's data through the admin API", async () => {
  for (const p of ['/tenants', '/keys', '/accounts', '/usage', `/keys?tenant_id=1`]) {
    const r = await request(`${gw.url}/admin/api/v1${p}`, { headers: { authorization: `Bearer ${KEY_A}` } });
    assert.equal(r.status, 401, `${p}: ${r.text}`);
    assert.ok(!r.text.includes('tenant-b'));
  }
});

test("a key's IP allow list: 403 ip_not_allowed from elsewhere, 200 from an allowed address", async () => {
  await mock.reset();
  const r = await chat(gw, KEY_OFFICE, chatReq('model-a'));
  assert.equal(r.status, 403, r.text);
  assert.equal(r.json?.error?.code, 'ip_not_allowed');
  assert.equal(r.json?.error?.type, 'permission_error');
  const ok = await chat(gw, KEY_LOCAL, chatReq('model-a'));
  assert.equal(ok.status, 200, ok.text);
  assert.equal((await credStats()).total, 1, 'the refused request never reached the upstream');
});

test("every request is billed to its own tenant: B's balance pays nothing for A", async () => {
  const ids = Object.fromEntries((await db.query('SELECT name, id FROM tenants')).map((t) => [t.name, t.id]));
  // Settlement is batched: wait until every answered request has its usage row.
  const answered = (await mock.stats()).total;
  await waitFor(async () => Number(await db.scalar('SELECT count(*) FROM usage')) > 0, { timeout: 10000, what: 'usage rows' });
  await waitFor(async () => Number(await db.scalar('SELECT count(*) FROM reservations WHERE state = \'reserved\'')) === 0,
    { timeout: 10000, what: 'every reservation settled' });
  assert.ok(answered > 0);
  const crossed = await db.scalar('SELECT count(*) FROM usage u JOIN api_keys k ON k.id = u.api_key_id WHERE k.tenant_id <> u.tenant_id');
  assert.equal(crossed, '0', "no usage row charges a key's request to another tenant");
  const byTenant = await db.query('SELECT t.name, t.balance::text AS balance, t.opening_balance::text AS opening, ' +
    "coalesce((SELECT sum(u.cost) FROM usage u WHERE u.tenant_id = t.id), 0)::text AS used, " +
    "(SELECT count(*) FROM usage u WHERE u.tenant_id = t.id) AS n FROM tenants t ORDER BY t.name");
  for (const t of byTenant) {
    assert.ok(t.n > 0, `${t.name} has usage rows`);
    assert.equal(Number(t.balance), Number(t.opening) - Number(t.used), `${t.name}: balance = opening - its own usage`);
  }
  const aRows = await adminClient(gw).read(`/usage?tenant_id=${ids['tenant-a']}&limit=1000`);
  assert.ok(aRows.data.length > 0 && aRows.data.every((u) => u.tenant_id === ids['tenant-a']), 'the usage query by tenant shows only that tenant');
});
