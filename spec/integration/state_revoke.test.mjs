// Two gateway instances share one Postgres and one Redis. A key that instance B has
// cached is revoked through instance A's admin API: B refuses it within 1 s (A
// publishes the change on Redis, every worker of every instance drops its cache). The
// same holds for re-activating, expiring and deleting a key; a wrong key gets the
// OpenAI-shaped 401 everywhere.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, sleep, startMock, stopAll } from './lib/harness.mjs';
import { adminClient, applyState, chat, chatReq, createDb, keyId, metrics, plainKey, startStateGateway } from './lib/db.mjs';

const KEY = plainKey('revoke');
const CRED = 'sk-revoke-account';
let db;
let mock;
let gwA;
let gwB;
let adminA;
let id;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme', balance: '10' }],
    groups: [{ name: 'main', models: [] }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, groups: ['main'] }],
    keys: [{ name: 'k', tenant: 'acme', group: 'main', key: KEY }],
  });
  id = await keyId(db, 'k');
  // Two workers each: the key must be refused by every worker of B, not just one.
  [gwA, gwB] = await Promise.all([startStateGateway(db, { workers: 2 }, { mock }), startStateGateway(db, { workers: 2 }, { mock })]);
  adminA = adminClient(gwA);
});

after(async () => {
  await stopAll();
  await db?.drop();
});

/** n requests to gw with KEY, each on a fresh connection (so both workers answer). */
async function statuses(gw, n, key = KEY) {
  const rs = await Promise.all(Array.from({ length: n }, () => chat(gw, key, chatReq(MODEL))));
  return rs.map((r) => r.status);
}

/**
 * Polls B until `n` requests in a row (fresh connections) all get `want`; resolves with
 * the ms since `t0`, or throws after `limit` ms.
 */
async function msUntil(gw, want, t0, limit, key = KEY) {
  for (let i = 0; i < 400; i++) {
    const s = await statuses(gw, 6, key);
    if (s.every((x) => x === want)) return Date.now() - t0;
    if (Date.now() - t0 > limit) throw new Error(`still ${JSON.stringify(s)} after ${Date.now() - t0} ms (want all ${want})`);
    await sleep(20);
  }
  throw new Error('unreachable');
}

async function warm(gw) {
  const s = await statuses(gw, 12);
  assert.deepEqual(s, Array(12).fill(200), 'the key works before the change');
  // Concurrent first requests all wait on one lookup per worker (single-flight): only
  // requests after it completes are cache hits, so ask again once it has.
  assert.deepEqual(await statuses(gw, 6), Array(6).fill(200), 'the key works from the cache');
  const m = await metrics(gw);
  assert.ok(m['tollgate_auth_cache_total{result="hit"}'] > 0, 'B serves the key from its cache');
}

test('a key revoked on instance A is refused by instance B within 1 s', async () => {
  await warm(gwB);
  const lookupsBefore = (await metrics(gwB)).tollgate_auth_db_lookups_total;
  assert.ok(lookupsBefore <= 2, `at most one lookup per worker while warming (${lookupsBefore})`);

  const t0 = Date.now();
  const r = await adminA.patch(`/keys/${id}`, { status: 'revoked' });
  assert.equal(r.status, 200, r.text);
  const ms = await msUntil(gwB, 401, t0, 1000);
  assert.ok(ms <= 1000, `B refused the revoked key after ${ms} ms`);

  // Every worker of B refuses it, now and later (nothing serves it from a stale cache).
  const s = await statuses(gwB, 20);
  assert.deepEqual(s, Array(20).fill(401));
  const res = await chat(gwB, KEY, chatReq(MODEL));
  assert.equal(res.json?.error?.code, 'invalid_api_key');
  assert.equal(res.json?.error?.type, 'invalid_request_error');
  assert.match(res.json?.error?.message, /revoked/);
  assert.deepEqual(await statuses(gwA, 6), Array(6).fill(401), 'A refuses it too');
});

test('re-activating the key on A is seen by B within 1 s', async () => {
  const t0 = Date.now();
  const r = await adminA.patch(`/keys/${id}`, { status: 'active' });
  assert.equal(r.status, 200, r.text);
  const ms = await msUntil(gwB, 200, t0, 1000);
  assert.ok(ms <= 1000, `B accepted the key again after ${ms} ms`);
});

test('an expiry set on A in the past is enforced by B within 1 s', async () => {
  await warm(gwB);
  const t0 = Date.now();
  const r = await adminA.patch(`/keys/${id}`, { expires_at: new Date(Date.now() - 60000).toISOString() });
  assert.equal(r.status, 200, r.text);
  const ms = await msUntil(gwB, 401, t0, 1000);
  assert.ok(ms <= 1000, `B refused the expired key after ${ms} ms`);
  const res = await chat(gwB, KEY, chatReq(MODEL));
  assert.match(res.json?.error?.message, /expired/);
  assert.equal((await adminA.patch(`/keys/${id}`, { expires_at: null })).status, 200);
  await msUntil(gwB, 200, Date.now(), 1000);
});

test('suspending the tenant on A refuses its keys on B within 1 s', async () => {
  await warm(gwB);
  const tenant = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  const t0 = Date.now();
  assert.equal((await adminA.patch(`/tenants/${tenant}`, { status: 'suspended' })).status, 200);
  const ms = await msUntil(gwB, 401, t0, 1000);
  assert.ok(ms <= 1000, `after ${ms} ms`);
  assert.equal((await adminA.patch(`/tenants/${tenant}`, { status: 'active' })).status, 200);
  await msUntil(gwB, 200, Date.now(), 1000);
});

test('a key deleted on A is refused by B within 1 s', async () => {
  await warm(gwB);
  const t0 = Date.now();
  assert.equal((await adminA.del(`/keys/${id}`)).status, 204);
  const ms = await msUntil(gwB, 401, t0, 1000);
  assert.ok(ms <= 1000, `B refused the deleted key after ${ms} ms`);
  const upstream = (await mock.stats()).credentials[CRED]?.requests ?? 0;
  await statuses(gwB, 10);
  assert.equal((await mock.stats()).credentials[CRED]?.requests ?? 0, upstream, 'refused requests never reach the upstream');
});

test('an account changed on A is used by B within 1 s (credential rotated, then disabled)', async () => {
  const created = await adminA.post('/keys', { tenant_id: Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'")), group_id: Number(await db.scalar("SELECT id FROM groups WHERE name = 'main'")), name: 'routing' });
  assert.equal(created.status, 201, created.text);
  const key = created.json.key;
  assert.ok(key);
  assert.deepEqual(await statuses(gwB, 4, key), [200, 200, 200, 200]);
  assert.equal((await mock.last()).headers.authorization, `Bearer ${CRED}`);

  const acct = Number(await db.scalar("SELECT id FROM accounts WHERE name = 'acct'"));
  const oldCount = async () => (await mock.stats()).credentials[CRED]?.requests ?? 0;
  const t0 = Date.now();
  assert.equal((await adminA.patch(`/accounts/${acct}`, { credential: `${CRED}-rotated` })).status, 200);
  // Done when a round of 8 requests on fresh connections (both workers of B) all went
  // upstream with the rotated credential.
  let ms = null;
  for (let i = 0; i < 200 && Date.now() - t0 <= 1000; i++) {
    const before = await oldCount();
    assert.deepEqual(await statuses(gwB, 8, key), Array(8).fill(200));
    if ((await oldCount()) === before) {
      ms = Date.now() - t0;
      break;
    }
    await sleep(20);
  }
  assert.ok(ms !== null && ms <= 1000, `B used the rotated credential after ${ms} ms`);

  const t1 = Date.now();
  assert.equal((await adminA.patch(`/accounts/${acct}`, { status: 'disabled' })).status, 200);
  const off = await msUntil(gwB, 503, t1, 1000, key);
  assert.ok(off <= 1000, `B stopped using the disabled account after ${off} ms`);
  const r = await chat(gwB, key, chatReq(MODEL));
  assert.equal(r.json?.error?.code, 'no_account_available');
  assert.equal((await adminA.patch(`/accounts/${acct}`, { status: 'active', credential: CRED })).status, 200);
  await msUntil(gwB, 200, Date.now(), 1000, key);
});

test('unknown keys get the OpenAI-shaped 401 on both instances', async () => {
  for (const gw of [gwA, gwB]) {
    for (const key of [plainKey('nope'), '', 'x'.repeat(300)]) {
      const r = await chat(gw, key, chatReq(MODEL));
      assert.equal(r.status, 401, `key ${JSON.stringify(key.slice(0, 20))}: ${r.text}`);
      assert.equal(r.json?.error?.code, 'invalid_api_key');
    }
  }
});
