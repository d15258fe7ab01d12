// The admin REST API under /admin/api/v1/ against a real Postgres: create, read,
// update and delete for every resource (tenants, users, groups, keys, accounts, prices),
// top-ups, usage queries, pagination (limit / after / has_more), the bearer admin token,
// and the clear 400s, 404s and 409s an operator gets for bad input. The plain API key
// is in the create response and nowhere else.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import net from 'node:net';
import path from 'node:path';

import { HOST, REPO, parseResponse, startMock, stopAll } from './lib/harness.mjs';
import { adminClient, createDb, request, sha256hex, startStateGateway } from './lib/db.mjs';

// An id no row has: above every sequence (they start below 1.1e9, see lib/db.mjs) and
// still a valid integer for the API.
const NO_ID = 2000000000;

let db;
let gw;
let admin;

before(async () => {
  const mock = await startMock();
  db = await createDb();
  // Group plugin settings are validated against the plugins in these folders.
  gw = await startStateGateway(db, { plugins: { dirs: [path.join(REPO, 'plugins')], watch: false } }, { mock });
  admin = adminClient(gw);
});

after(async () => {
  await stopAll();
  await db?.drop();
});

/** Asserts an OpenAI-shaped error with this status and (optionally) code. */
function assertError(r, status, code, what = '') {
  assert.equal(r.status, status, `${what}: expected ${status}, got ${r.status}: ${r.text}`);
  assert.equal(typeof r.json?.error?.message, 'string', `${what}: error.message in ${r.text}`);
  assert.ok(r.json.error.message.length > 0);
  assert.equal(typeof r.json.error.type, 'string', `${what}: error.type`);
  if (code) assert.equal(r.json.error.code, code, `${what}: code in ${r.text}`);
  assert.match(r.headers['content-type'] || '', /application\/json/);
}

test('every call needs the admin token: missing, wrong or malformed → 401', async () => {
  for (const [what, token, headers] of [
    ['no header', null, {}],
    ['wrong token', 'adm-wrong', {}],
    ['token with a suffix', 'adm-test-and-more', {}],
    ['a prefix of the token', 'adm-tes', {}],
    ['basic auth', null, { authorization: 'Basic YWRtOmFkbS10ZXN0' }],
  ]) {
    for (const [method, p] of [['GET', '/tenants'], ['POST', '/tenants'], ['DELETE', '/tenants/1'], ['GET', '/usage']]) {
      const r = await admin.call(method, p, method === 'POST' ? { name: 'x' } : undefined, { token, headers });
      assertError(r, 401, 'invalid_admin_token', `${what} ${method} ${p}`);
    }
  }
  assert.equal(await db.scalar('SELECT count(*) FROM tenants'), '0', 'nothing was created');
});

test('tenants: create, read, update, top up, delete', async () => {
  const t = await admin.create('/tenants', { name: 'acme', balance: '12.50', budget: 100 });
  assert.ok(Number.isInteger(t.id));
  assert.equal(t.name, 'acme');
  assert.equal(t.balance, 12.5);
  assert.equal(t.budget, 100);
  assert.equal(t.status, 'active');
  assert.equal(t.spend, 0);
  assert.ok(!Number.isNaN(Date.parse(t.created_at)));

  assert.deepEqual(await admin.read(`/tenants/${t.id}`), t);
  const u = await admin.update(`/tenants/${t.id}`, { status: 'suspended', budget: null });
  assert.equal(u.status, 'suspended');
  assert.equal(u.budget, null);
  assert.equal(u.balance, 12.5);
  assert.equal((await admin.read(`/tenants/${t.id}`)).status, 'suspended');

  // Money goes through top-ups (and the ledger), never through PATCH.
  assertError(await admin.patch(`/tenants/${t.id}`, { balance: '1000' }), 400, 'invalid_request', 'PATCH balance');
  const top = await admin.post(`/tenants/${t.id}/topup`, { amount: '25.25', note: 'invoice 7' });
  assert.equal(top.status, 200, top.text);
  assert.equal(top.json.balance, 37.75);
  const ledger = await db.query(`SELECT kind, amount::text, note FROM ledger WHERE tenant_id = ${t.id} ORDER BY id`);
  assert.deepEqual(ledger.map((l) => [l.kind, Number(l.amount), l.note]), [['topup', 25.25, 'invoice 7']]);
  for (const bad of [{ amount: '-5' }, { amount: '0' }, { amount: 'lots' }, {}, { amount: '1', note: 5 }]) {
    assertError(await admin.post(`/tenants/${t.id}/topup`, bad), 400, 'invalid_request', `topup ${JSON.stringify(bad)}`);
  }
  assertError(await admin.post(`/tenants/${NO_ID}/topup`, { amount: '1' }), 404, 'not_found', 'topup unknown tenant');
  assert.equal(Number(await db.scalar(`SELECT balance FROM tenants WHERE id = ${t.id}`)), 37.75);

  assertError(await admin.post('/tenants', { name: 'acme' }), 409, 'conflict', 'duplicate name');
  // A tenant with money history (a ledger row) is not deleted: the ledger is kept.
  const refused = await admin.del(`/tenants/${t.id}`);
  assert.ok(refused.status === 400 || refused.status === 409, `delete with history: ${refused.status} ${refused.text}`);
  assert.equal(typeof refused.json?.error?.code, 'string');
  assert.equal((await admin.read(`/tenants/${t.id}`)).name, 'acme');

  const fresh = await admin.create('/tenants', { name: 'short-lived' });
  const del = await admin.del(`/tenants/${fresh.id}`);
  assert.equal(del.status, 204, del.text);
  assert.equal(del.text, '');
  assertError(await admin.get(`/tenants/${fresh.id}`), 404, 'not_found', 'deleted tenant');
  assertError(await admin.del(`/tenants/${fresh.id}`), 404, 'not_found', 'delete twice');
});

test('users: create under a tenant, filter by tenant, update, delete; bad references', async () => {
  const t1 = await admin.create('/tenants', { name: 'users-1' });
  const t2 = await admin.create('/tenants', { name: 'users-2' });
  const a = await admin.create('/users', { tenant_id: t1.id, email: 'a@example.com', name: 'Ann', role: 'owner' });
  const b = await admin.create('/users', { tenant_id: t2.id, email: 'b@example.com' });
  assert.equal(a.tenant_id, t1.id);
  assert.equal(a.role, 'owner');
  assert.equal(b.role, 'member', 'the default role');
  assert.equal(b.name, null);
  const only1 = await admin.read(`/users?tenant_id=${t1.id}`);
  assert.deepEqual(only1.data.map((u) => u.id), [a.id]);
  assert.equal(only1.has_more, false);

  assert.equal((await admin.update(`/users/${a.id}`, { role: 'admin', name: null })).role, 'admin');
  assertError(await admin.patch(`/users/${a.id}`, { tenant_id: t2.id }), 400, 'invalid_request', 'move a user');
  assertError(await admin.patch(`/users/${a.id}`, { role: 'root' }), 400, 'invalid_request', 'bad role');
  assertError(await admin.post('/users', { tenant_id: NO_ID, email: 'x@example.com' }), 400, 'invalid_reference', 'FK');
  assertError(await admin.post('/users', { tenant_id: t1.id, email: 'a@example.com' }), 409, 'conflict', 'same email');
  assertError(await admin.post('/users', { email: 'nobody@example.com' }), 400, 'invalid_request', 'missing tenant_id');
  assert.equal((await admin.del(`/users/${b.id}`)).status, 204);
  assertError(await admin.get(`/users/${b.id}`), 404, 'not_found');
});

test('groups, accounts and prices: full CRUD; credentials are write-only', async () => {
  const plugins = { 'model-map': { config: { aliases: { 'm-3': 'm-1' } } }, router: { enabled: false } };
  const g = await admin.create('/groups', { name: 'gold', models: ['m-1', 'm-2'], rate_multiplier: '1.5', plugins });
  assert.deepEqual(g.models, ['m-1', 'm-2']);
  assert.equal(g.rate_multiplier, 1.5);
  assert.deepEqual(g.plugins, plugins);
  // A setting for a plugin that does not exist is refused, naming it.
  const pii = await admin.post('/groups', { name: 'pii', plugins: { pii: { config: { on: true } } } });
  assertError(pii, 400, 'invalid_request', 'unknown plugin');
  assert.match(pii.json.error.message, /plugins\.pii: not found/);
  const g2 = await admin.create('/groups', { name: 'silver' });
  assert.deepEqual(g2.models, []);

  const cred = `sk-admin-secret-${Date.now()}`;
  const acc = await admin.create('/accounts', {
    name: 'acct-1', provider: 'openai', base_url: 'http://127.0.0.1:9/v1', credential: cred,
    concurrency: 3, priority: 5, models: ['m-1'], model_map: { 'm-2': 'm-1' }, groups: [g.id, g2.id],
  });
  assert.equal(acc.has_credential, true);
  assert.deepEqual(acc.groups, [g.id, g2.id]);
  assert.equal(acc.concurrency, 3);
  assert.deepEqual(acc.model_map, { 'm-2': 'm-1' });
  assert.ok(!('credential' in acc), `no credential in ${JSON.stringify(acc)}`);
  const readAcc = await admin.read(`/accounts/${acc.id}`);
  assert.ok(!('credential' in readAcc));
  assert.deepEqual(readAcc.groups, [g.id, g2.id]);
  const upd = await admin.update(`/accounts/${acc.id}`, { groups: [], status: 'disabled' });
  assert.deepEqual(upd.groups, []);
  assert.equal(upd.status, 'disabled');
  assert.equal(await db.scalar(`SELECT count(*) FROM account_groups WHERE account_id = ${acc.id}`), '0');
  assertError(await admin.post('/accounts', { name: 'acct-2', provider: 'cohere', base_url: 'http://x/v1' }), 400, 'invalid_request', 'provider enum');
  assertError(await admin.post('/accounts', { name: 'acct-2', provider: 'openai', base_url: 'ftp://x' }), 400, undefined, 'base_url check');
  assertError(await admin.post('/accounts', { name: 'acct-2', provider: 'openai', base_url: 'http://x/v1', groups: [NO_ID] }), 400, 'invalid_reference', 'unknown group');
  assert.equal(await db.scalar("SELECT count(*) FROM accounts WHERE name = 'acct-2'"), '0', 'the failed create left no account behind');

  const p = await admin.create('/prices', { model: 'org/model-x', input: '0.15', output: 0.6, cache_read: '0.075' });
  assert.equal(p.model, 'org/model-x');
  assert.equal(p.input, 0.15);
  assert.equal(p.reasoning, null);
  const enc = encodeURIComponent('org/model-x');
  assert.equal((await admin.read(`/prices/${enc}`)).output, 0.6);
  assert.equal((await admin.update(`/prices/${enc}`, { input: '0.2000000001' })).input, 0.2000000001);
  assertError(await admin.patch(`/prices/${enc}`, { model: 'renamed' }), 400, 'invalid_request', 'rename a price');
  assertError(await admin.post('/prices', { model: 'org/model-x' }), 409, 'conflict', 'duplicate price');
  assertError(await admin.post('/prices', { model: 'neg', input: -1 }), 400, 'invalid_request', 'negative price');

  assert.equal((await admin.update(`/groups/${g.id}`, { models: [] })).models.length, 0);
  for (const [path, id] of [['prices', enc], ['accounts', acc.id], ['groups', g.id], ['groups', g2.id]]) {
    const r = await admin.del(`/${path}/${id}`);
    assert.equal(r.status, 204, `${path} delete: ${r.text}`);
    assertError(await admin.get(`/${path}/${id}`), 404, 'not_found', `${path} after delete`);
  }
  assert.equal(await db.scalar('SELECT count(*) FROM account_groups'), '0');
});

test('keys: the plain key is returned once, at creation; stored as SHA-256; update and revoke', async () => {
  const t = await admin.create('/tenants', { name: 'keys-tenant' });
  const g = await admin.create('/groups', { name: 'keys-group' });
  const created = await admin.post('/keys', { tenant_id: t.id, group_id: g.id, name: 'ci', rpm: 60, allowed_models: ['m-1'], ip_allow: ['127.0.0.1/32'] });
  assert.equal(created.status, 201, created.text);
  const k = created.json;
  assert.equal(typeof k.key, 'string');
  assert.ok(k.key.length >= 20, `a long random key: ${k.key}`);
  assert.equal(k.prefix, k.key.slice(0, 8));
  assert.equal(k.rpm, 60);
  assert.deepEqual(k.allowed_models, ['m-1']);
  assert.equal(k.status, 'active');
  assert.equal(await db.scalar(`SELECT encode(key_hash, 'hex') FROM api_keys WHERE id = ${k.id}`), sha256hex(k.key));

  const again = await admin.read(`/keys/${k.id}`);
  assert.ok(!('key' in again) && !('key_hash' in again), `GET shows no key: ${JSON.stringify(again)}`);
  const list = await admin.get(`/keys?tenant_id=${t.id}`);
  assert.equal(list.json.data.length, 1);
  assert.ok(!list.text.includes(k.key), 'the list does not contain the plain key');

  const u = await admin.update(`/keys/${k.id}`, { status: 'revoked', rpm: null, tpm: 1000, concurrency: 2, expires_at: '2030-01-01T00:00:00Z' });
  assert.equal(u.status, 'revoked');
  assert.equal(u.rpm, null);
  assert.equal(u.tpm, 1000);
  assert.equal(Date.parse(u.expires_at), Date.parse('2030-01-01T00:00:00Z'));
  assert.ok(!u.key);
  assertError(await admin.patch(`/keys/${k.id}`, { status: 'paused' }), 400, 'invalid_request', 'status enum');
  assertError(await admin.patch(`/keys/${k.id}`, { key_hash: 'aa' }), 400, 'invalid_request', 'key_hash is not writable');
  assertError(await admin.patch(`/keys/${k.id}`, { prefix: 'aa' }), 400, 'invalid_request', 'prefix is read-only');
  assertError(await admin.patch(`/keys/${k.id}`, { expires_at: 'next tuesday' }), 400, undefined, 'bad timestamp');
  assertError(await admin.post('/keys', { tenant_id: NO_ID }), 400, 'invalid_reference', 'key of an unknown tenant');
  assertError(await admin.post('/keys', { tenant_id: t.id, group_id: NO_ID }), 400, 'invalid_reference', 'key of an unknown group');
  assertError(await admin.post('/keys', { tenant_id: t.id, key: 'my-own-key-1234567890' }), 400, 'invalid_request', 'choosing the key');
  const del = await admin.del(`/keys/${k.id}`);
  assert.equal(del.status, 204);
  assertError(await admin.get(`/keys/${k.id}`), 404, 'not_found');
});

test('pagination: limit, after, has_more and next_after walk every row once, in order', async () => {
  const names = Array.from({ length: 7 }, (_, i) => `page-${i}`);
  const ids = [];
  for (const n of names) ids.push((await admin.create('/tenants', { name: n })).id);
  const all = (await admin.read('/tenants?limit=500')).data.map((t) => t.id);
  for (const id of ids) assert.ok(all.includes(id));

  const seen = [];
  let after;
  for (let page = 0; page < 20; page++) {
    const r = await admin.read(`/tenants?limit=3${after !== undefined ? `&after=${after}` : ''}`);
    assert.ok(r.data.length <= 3, `page ${page} has ${r.data.length} rows`);
    seen.push(...r.data.map((t) => t.id));
    if (!r.has_more) {
      assert.ok(r.data.length > 0 || page === 0 || seen.length === all.length);
      break;
    }
    assert.equal(r.data.length, 3, 'a page before the last is full');
    assert.equal(r.next_after, r.data[r.data.length - 1].id);
    after = r.next_after;
  }
  assert.deepEqual(seen, all, 'every row once, ordered by id');
  assert.deepEqual([...seen].sort((a, b) => a - b), seen);

  const last = await admin.read(`/tenants?limit=2&after=${all[all.length - 2]}`);
  assert.deepEqual(last.data.map((t) => t.id), [all[all.length - 1]]);
  assert.equal(last.has_more, false);
  const exact = await admin.read(`/tenants?limit=${all.length}`);
  assert.equal(exact.data.length, all.length);
  assert.equal(exact.has_more, false, 'a page that ends exactly at the last row has no more');
  const empty = await admin.read(`/tenants?after=${all[all.length - 1]}`);
  assert.deepEqual(empty.data, []);
  assert.equal(empty.has_more, false);

  for (const q of ['limit=0', 'limit=501', 'limit=abc', 'limit=-1', 'after=abc', 'after=1%20OR%201=1']) {
    assertError(await admin.get(`/tenants?${q}`), 400, 'invalid_request', q);
  }
  const def = await admin.read('/tenants');
  assert.ok(def.data.length <= 50);
});

test('malformed bodies get clear 400s', async () => {
  const t = await admin.create('/tenants', { name: 'bodies' });
  const tenantsBefore = await db.scalar('SELECT count(*) FROM tenants');
  const cases = [
    ['not JSON', '{"name":', 'invalid_json'],
    ['trailing garbage', '{"name":"a"} x', 'invalid_json'],
    ['empty body', '', 'invalid_json'],
    ['duplicate field', '{"name":"a","name":"b"}', 'invalid_json'],
    ['an array', '[{"name":"a"}]', 'invalid_request'],
    ['a string', '"tenant"', undefined],
    ['unknown field', { name: 'x', colour: 'red' }, 'invalid_request', /colour/],
    ['read-only id', { name: 'x', id: 5 }, 'invalid_request', /id/],
    ['read-only spend', { name: 'x', spend: 5 }, 'invalid_request', /spend/],
    ['name a number', { name: 5 }, 'invalid_request', /name/],
    ['name empty', { name: '' }, 'invalid_request', /name/],
    ['name null', { name: null }, 'invalid_request', /name/],
    ['name too long', { name: 'n'.repeat(5000) }, 'invalid_request', /name/],
    ['budget negative', { name: 'x', budget: -1 }, 'invalid_request', /budget/],
    ['budget text', { name: 'x', budget: 'ten' }, 'invalid_request', /budget/],
    ['status enum', { name: 'x', status: 'gone' }, 'invalid_request', /status/],
    ['missing name', { budget: 1 }, 'invalid_request', /name/],
  ];
  for (const [what, body, code, msg] of cases) {
    const r = await admin.post('/tenants', body);
    assertError(r, 400, code, what);
    if (msg) assert.match(r.json.error.message, msg, `${what}: the message names the field`);
  }
  const keyCases = [
    ['rpm a string', { tenant_id: t.id, rpm: '60' }, /rpm/],
    ['rpm negative', { tenant_id: t.id, rpm: -1 }, /rpm/],
    ['rpm fractional', { tenant_id: t.id, rpm: 1.5 }, /rpm/],
    ['rpm too big', { tenant_id: t.id, rpm: 2 ** 40 }, /rpm/],
    ['models not a list', { tenant_id: t.id, allowed_models: 'm-1' }, /allowed_models/],
    ['models of numbers', { tenant_id: t.id, allowed_models: [1, 2] }, /allowed_models/],
    ['tenant_id a string', { tenant_id: String(t.id) }, /tenant_id/],
  ];
  for (const [what, body, msg] of keyCases) {
    const r = await admin.post('/keys', body);
    assertError(r, 400, 'invalid_request', what);
    assert.match(r.json.error.message, msg, what);
  }
  assertError(await admin.patch(`/tenants/${t.id}`, {}), 400, 'invalid_request', 'empty PATCH');
  assertError(await admin.post('/groups', { name: 'g', plugins: ['not', 'an', 'object'] }), 400, 'invalid_request', 'plugins array');
  assertError(await admin.post('/keys', { tenant_id: t.id, ip_allow: ['not-an-ip'] }), 400, undefined, 'bad CIDR');
  assert.equal(await db.scalar('SELECT count(*) FROM tenants'), tenantsBefore, 'none of the bad bodies created anything');
  assert.equal(await db.scalar(`SELECT count(*) FROM api_keys WHERE tenant_id = ${t.id}`), '0');
});

test('accounts: replacing the group set keeps the groups in both the old and the new set', async () => {
  const a = await admin.create('/groups', { name: 'overlap-a' });
  const b = await admin.create('/groups', { name: 'overlap-b' });
  const c = await admin.create('/groups', { name: 'overlap-c' });
  const acc = await admin.create('/accounts', { name: 'acct-overlap', provider: 'openai', base_url: 'http://127.0.0.1:9/v1', groups: [a.id, b.id] });
  assert.deepEqual(acc.groups, [a.id, b.id]);
  const r = await admin.patch(`/accounts/${acc.id}`, { groups: [b.id, c.id] });
  assert.equal(r.status, 200, `PATCH groups [a,b] -> [b,c]: ${r.text}`);
  assert.deepEqual(r.json.groups, [b.id, c.id]);
  const rows = await db.query(`SELECT group_id FROM account_groups WHERE account_id = ${acc.id} ORDER BY group_id`);
  assert.deepEqual(rows.map((x) => x.group_id), [b.id, c.id]);
});

/** Sends raw bytes on one connection; resolves with everything received until close. */
async function rawExchange(bytes, timeout = 5000) {
  const s = net.connect(gw.port, HOST);
  const parts = [];
  s.on('data', (d) => parts.push(d));
  s.on('error', () => {});
  await new Promise((resolve, reject) => {
    s.once('connect', resolve);
    s.once('error', reject);
  });
  s.write(bytes);
  await new Promise((resolve) => {
    const timer = setTimeout(resolve, timeout);
    s.once('close', () => {
      clearTimeout(timer);
      resolve();
    });
  });
  s.destroy();
  return Buffer.concat(parts);
}

test('a body over limits.max_body_bytes gets exactly one 413, and nothing is stored', async () => {
  const big = Buffer.from(JSON.stringify({ name: 'big', budget: 1, pad: 'x'.repeat(gw.config.limits.max_body_bytes + 10) }));
  // Headers and body in one write, as any HTTP client sends them.
  const head = `POST /admin/api/v1/tenants HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer adm-test\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${big.length}\r\n\r\n`;
  const got = await rawExchange(Buffer.concat([Buffer.from(head), big]));
  const first = parseResponse(got, true);
  assert.ok(first, `a response: ${JSON.stringify(got.toString('latin1').slice(0, 300))}`);
  assert.equal(first.status, 413);
  assert.equal(first.json?.error?.code, 'body_too_large');
  assert.match(first.headers.connection || '', /close/);
  const rest = got.subarray(first.size).toString('latin1');
  assert.equal(rest, '', `nothing may follow a response that said Connection: close; got ${JSON.stringify(rest.slice(0, 400))}`);
  assert.equal(await db.scalar("SELECT count(*) FROM tenants WHERE name = 'big'"), '0');
  // The gateway still serves the admin API afterwards.
  assert.equal((await admin.get('/tenants?limit=1')).status, 200);
});

test('the ranges the schema allows: negative priorities, ids past 32 bits; numbers past 64 bits are refused', async () => {
  const acc = await admin.create('/accounts', {
    name: 'backup-acct', provider: 'openai', base_url: 'http://127.0.0.1:9/v1', credential: 'sk-range', priority: -5,
  });
  assert.equal(acc.priority, -5, 'a negative priority (a fallback account) is stored');
  const low = await admin.post('/accounts', { name: 'too-low', provider: 'openai', base_url: 'http://127.0.0.1:9/v1', priority: -(2 ** 31) - 1 });
  assertError(low, 400, 'invalid_request', 'priority below int32');
  assert.match(low.json.error.message, /priority/);
  // A group id past 2^31-1 is a valid bigint: refused only because no such group exists.
  const t = await admin.create('/tenants', { name: 'ranges' });
  const far = await admin.post('/keys', { tenant_id: t.id, group_id: 3_000_000_000 });
  assert.notEqual(far.status, 500);
  assert.doesNotMatch(far.json?.error?.message ?? '', /must be/, 'not refused for its type');
  assertError(await admin.post('/keys', { tenant_id: t.id, group_id: 0 }), 400, 'invalid_request', 'group_id 0');
  // Digits that fit no bigint: 404 for a path id, 400 for a query parameter, never a 500.
  assertError(await admin.get('/tenants/99999999999999999999999'), 404, 'not_found', 'huge path id');
  for (const q of ['limit=99999999999999999999', 'limit=4294967297', 'after=99999999999999999999999']) {
    assertError(await admin.get(`/tenants?${q}`), 400, 'invalid_request', q);
  }
  assertError(await admin.get('/usage?tenant_id=99999999999999999999999'), 400, 'invalid_request', 'usage huge tenant');
});

test('unknown ids, routes and methods', async () => {
  for (const r of ['tenants', 'users', 'groups', 'keys', 'accounts']) {
    assertError(await admin.get(`/${r}/999999999999`), 404, 'not_found', `GET ${r}`);
    assertError(await admin.patch(`/${r}/999999999999`, r === 'accounts' ? { priority: 1 } : r === 'users' ? { role: 'member' } : { name: 'zz' }), 404, 'not_found', `PATCH ${r}`);
    assertError(await admin.del(`/${r}/999999999999`), 404, 'not_found', `DELETE ${r}`);
    assertError(await admin.get(`/${r}/abc`), 404, 'not_found', `GET ${r}/abc`);
  }
  assertError(await admin.get('/prices/no-such-model'), 404, 'not_found', 'price');
  assertError(await admin.get('/widgets'), 404, 'not_found', 'unknown resource');
  assertError(await admin.get('/tenants/1/extra/more'), 404, 'not_found', 'deep path');
  assertError(await admin.call('PUT', '/tenants', { name: 'x' }), 405, 'method_not_allowed', 'PUT collection');
  assertError(await admin.call('POST', '/usage', {}), 405, 'method_not_allowed', 'POST usage');
  assertError(await admin.get('/tenants/1/topup'), 405, 'method_not_allowed', 'GET topup');
});

test('usage, usage summary and plugins answer with JSON', async () => {
  const u = await admin.read('/usage?limit=10');
  assert.ok(Array.isArray(u.data));
  const s = await admin.read('/usage/summary?group_by=model');
  assert.equal(s.group_by, 'model');
  assert.ok(Array.isArray(s.data));
  for (const g of ['key', 'tenant', 'hour', 'day']) assert.equal((await admin.read(`/usage/summary?group_by=${g}`)).group_by, g);
  assertError(await admin.get('/usage/summary?group_by=colour'), 400, 'invalid_request', 'group_by');
  assertError(await admin.get('/usage?tenant_id=x'), 400, 'invalid_request', 'tenant_id');
  assertError(await admin.get('/usage?limit=5000'), 400, 'invalid_request', 'usage limit');
  const p = await admin.get('/plugins');
  assert.equal(p.status, 200);
  assert.ok(p.json && typeof p.json === 'object', p.text);
  // The data plane does not serve the admin API with a client key.
  const viaClient = await request(`${gw.url}/admin/api/v1/tenants`, { headers: { authorization: 'Bearer tg-test-key' } });
  assertError(viaClient, 401, 'invalid_admin_token', 'a client key is not an admin token');
});
