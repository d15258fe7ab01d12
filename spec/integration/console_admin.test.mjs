// The admin API behind the console's account work (issue "console", item 1): unusable
// base URLs and model maps refused on write (admin API and `tollgate apply`, naming the
// field); an account the gateway cannot use shown with the reason ("problem"); and
// POST /accounts/{id}/test, which sends one small request through one account and
// reports timing, the upstream's status and its error. Hostile bodies to the new route
// get 400s in the admin API's error shape and the worker stays up.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { after, before, test } from 'node:test';

import { fetchT, freePort, startMock, stopAll } from './lib/harness.mjs';
import { adminClient, applyState, chat, chatReq, createDb, metrics, startStateGateway, stateFile, tool } from './lib/db.mjs';

const MODEL = 'gpt-4o-mini';
let db;
let mock;
let gw;
let admin;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    groups: [{ name: 'main' }],
    accounts: [
      { name: 'good', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-good', groups: ['main'], model_map: { 'gpt-4o-mini': 'mock-mini' } },
      { name: 'refused', provider: 'anthropic', base_url: `${mock.url}/v1`, credential: 'sk-bad', groups: ['main'], models: ['claude-x'] },
    ],
  });
  gw = await startStateGateway(db, {}, { mock });
  admin = adminClient(gw);
});

after(async () => {
  await stopAll();
  await db?.drop();
});

const idOf = async (name) => Number(await db.scalar(`SELECT id FROM accounts WHERE name = '${name}'`));

function assertAdminError(r, status, what) {
  assert.equal(r.status, status, `${what}: ${r.status} ${r.text}`);
  assert.equal(typeof r.json?.error?.message, 'string', `${what}: the admin error shape: ${r.text}`);
  assert.equal(typeof r.json?.error?.code, 'string', `${what}: ${r.text}`);
}

test('unusable base URLs and model maps are refused on write, naming the field (admin API and apply)', async () => {
  const base = { name: 'x', provider: 'openai', base_url: `${mock.url}/v1` };
  const cases = [
    ['base_url', { ...base, base_url: 'http://' }],
    ['base_url', { ...base, base_url: 'https://' }],
    ['base_url', { ...base, base_url: 'http://exa mple.com/v1' }],
    ['model_map', { ...base, model_map: { a: 1 } }],
    ['model_map', { ...base, model_map: { a: '' } }],
  ];
  const before = await db.scalar('SELECT count(*) FROM accounts');
  for (const [field, body] of cases) {
    const r = await admin.post('/accounts', body);
    assertAdminError(r, 400, JSON.stringify(body));
    assert.ok(r.json.error.message.includes(`"${field}"`), `names ${field}: ${r.json.error.message}`);
  }
  for (const [field, body] of cases) {
    const r = await tool(['apply', stateFile({ accounts: [body] })], { db });
    assert.notEqual(r.code, 0, `apply accepted ${JSON.stringify(body)}`);
    assert.match(r.stderr, new RegExp(`accounts\\[1\\]: field "${field}"`), r.stderr);
  }
  assert.equal(await db.scalar('SELECT count(*) FROM accounts'), before, 'nothing was written');
});

/** Sealed like tg_crypto_seal, with another key than the gateway's. */
function sealWithOtherKey(plain) {
  const nonce = crypto.randomBytes(12);
  const c = crypto.createCipheriv('aes-256-gcm', crypto.randomBytes(32), nonce);
  const ct = Buffer.concat([c.update(plain, 'utf8'), c.final()]);
  return Buffer.concat([Buffer.from([1]), nonce, ct, c.getAuthTag()]).toString('hex');
}

test('an account the gateway cannot use is listed with the reason; a good one with none', async () => {
  // As a hand-written SQL statement or an old dump would leave them.
  await db.exec(`INSERT INTO accounts (name, provider, base_url, model_map, credential) VALUES
    ('bad-url', 'openai', 'http://', '{}', NULL),
    ('bad-map', 'openai', '${mock.url}/v1', '{"a": 1}', NULL),
    ('bad-cred', 'openai', '${mock.url}/v1', '{}', '\\x${sealWithOtherKey('sk-x')}'::bytea)`);
  // Any admin write makes the gateway reload its accounts.
  await admin.update(`/accounts/${await idOf('good')}`, { weight: 100 });
  let list;
  const deadline = Date.now() + 5000;
  do {
    list = (await admin.read('/accounts')).data;
  } while (!list.find((a) => a.name === 'bad-cred')?.problem && Date.now() < deadline && (await new Promise((r) => setTimeout(r, 100)), true));
  const by = Object.fromEntries(list.map((a) => [a.name, a]));
  assert.equal(by.good.problem, null);
  assert.equal(by.refused.problem, null);
  assert.match(by['bad-url'].problem, /base_url has no host/);
  assert.match(by['bad-map'].problem, /model_map/);
  assert.match(by['bad-cred'].problem, /credential cannot be opened/);
  const one = await admin.read(`/accounts/${by['bad-url'].id}`);
  assert.match(one.problem, /base_url/);

  // Testing it says why, without calling anything.
  const stats = (await mock.stats()).total;
  const r = await admin.post(`/accounts/${by['bad-url'].id}/test`, {});
  assertAdminError(r, 409, 'test of a broken account');
  assert.equal(r.json.error.code, 'account_unusable');
  assert.match(r.json.error.message, /cannot use this account: base_url has no host/);
  assert.equal((await mock.stats()).total, stats);
  for (const n of ['bad-url', 'bad-map', 'bad-cred']) assert.equal((await admin.del(`/accounts/${by[n].id}`)).status, 204);
});

test('test: a good account answers with timing and the reply, through its credential and model map', async () => {
  await mock.reset();
  const r = await admin.post(`/accounts/${await idOf('good')}/test`, { model: MODEL });
  assert.equal(r.status, 200, r.text);
  const t = r.json;
  assert.equal(t.ok, true, r.text);
  assert.equal(t.status, 200);
  assert.equal(t.model, MODEL);
  assert.equal(t.upstream_model, 'mock-mini');
  assert.equal(t.error, null);
  assert.match(t.reply, /tok1/);
  assert.ok(t.first_byte_ms > 0 && t.total_ms >= t.first_byte_ms, r.text);
  const last = await mock.last();
  assert.equal(last.path, '/v1/chat/completions');
  assert.equal(last.headers.authorization, 'Bearer sk-good');
  assert.equal(JSON.parse(last.body).model, 'mock-mini');
  // Without a model: the account's first listed or mapped model.
  const d = await admin.post(`/accounts/${await idOf('good')}/test`);
  assert.equal(d.status, 200, d.text);
  assert.equal(d.json.model, MODEL);
});

test('test: an upstream refusal, an unreachable upstream and an unknown account are reported plainly', async () => {
  const fault = await fetchT(`${mock.url}/_mock/faults`, { method: 'POST', body: JSON.stringify({ credential: 'sk-bad', status: 401 }) });
  assert.equal(fault.status, 200, await fault.text());
  const r = await admin.post(`/accounts/${await idOf('refused')}/test`, {});
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.ok, false);
  assert.equal(r.json.status, 401);
  assert.equal(r.json.model, 'claude-x');
  assert.equal(r.json.path, '/messages');
  assert.equal(r.json.error.kind, 'upstream');
  assert.ok(r.json.error.message.length > 3, r.text);
  assert.match(r.json.body, /error/);
  assert.equal((await mock.last()).headers['x-api-key'], 'sk-bad');

  // A port nobody listens on, created a moment ago (the test waits for the snapshot).
  const port = await freePort();
  const acc = await admin.create('/accounts', { name: 'nowhere', provider: 'openai', base_url: `http://127.0.0.1:${port}/v1`, credential: 'sk-n' });
  const n = await admin.post(`/accounts/${acc.id}/test`, { model: MODEL });
  assert.equal(n.status, 200, n.text);
  assert.equal(n.json.ok, false);
  assert.equal(n.json.status, null);
  assert.equal(n.json.error.kind, 'connect');
  assert.ok(n.json.error.message, n.text);

  assertAdminError(await admin.post('/accounts/999999/test', {}), 404, 'unknown account');
});

test('hostile bodies to the test route: clear 400s in the admin error shape, and the worker stays up', async () => {
  const id = await idOf('good');
  const p = `/accounts/${id}/test`;
  const cases = [
    ['{"model":', 'invalid_json'],
    ['[]', 'invalid_request'],
    ['"gpt"', 'invalid_request'],
    [{ model: 5 }, 'invalid_request'],
    [{ model: '' }, 'invalid_request'],
    [{ model: 'a\r\nX-Evil: 1' }, 'invalid_request'],
    [{ model: 'x'.repeat(300) }, 'invalid_request'],
    [{ model: MODEL, extra: true }, 'invalid_request'],
    [JSON.stringify({ model: 'y'.repeat(5000) }), 'invalid_request'],
    ['{"model":"a","model":"b"}', 'invalid_json'],
  ];
  for (const [body, code] of cases) {
    const r = await admin.post(p, body);
    assertAdminError(r, 400, `body ${String(JSON.stringify(body)).slice(0, 60)}`);
    assert.equal(r.json.error.code, code, r.text);
  }
  assertAdminError(await admin.get(p), 405, 'GET test');
  assertAdminError(await admin.post('/accounts/abc/test', {}), 404, 'non-numeric id');
  assertAdminError(await admin.post(p, {}, { token: 'wrong' }), 401, 'wrong token');
  const ok = await admin.post(p, { model: MODEL });
  assert.equal(ok.status, 200, ok.text);
  assert.equal(ok.json.ok, true);
});

test('database refusals become sentences that say what to do, naming the field', async () => {
  const t = await admin.create('/tenants', { name: 'payer', balance: '1' });
  const dup = await admin.post('/tenants', { name: 'payer' });
  assertAdminError(dup, 409, 'duplicate tenant');
  assert.equal(dup.json.error.code, 'conflict');
  assert.equal(dup.json.error.param, 'name');
  assert.match(dup.json.error.message, /^A tenant with this name already exists: pick another name\.$/);
  assert.ok(!/_key|constraint|duplicate key/.test(dup.json.error.message));

  const long = await admin.post('/groups', { name: 'g'.repeat(201) });
  assertAdminError(long, 400, 'long name');
  assert.equal(long.json.error.param, 'name');
  assert.match(long.json.error.message, /1 to 200 characters/);

  const big = await admin.post('/groups', { name: 'big', rate_multiplier: '10000000' });
  assertAdminError(big, 400, 'overflow');
  assert.equal(big.json.error.param, 'rate_multiplier');
  assert.match(big.json.error.message, /below 1000000/);
  assert.ok(!/numeric field overflow/.test(big.json.error.message));

  const fk = await admin.post('/keys', { tenant_id: t.id, group_id: 987654 });
  assertAdminError(fk, 400, 'unknown group');
  assert.equal(fk.json.error.code, 'invalid_reference');
  assert.equal(fk.json.error.param, 'group_id');
  assert.match(fk.json.error.message, /No group has this id/);

  const when = await admin.post('/keys', { tenant_id: t.id, expires_at: 'next tuesday' });
  assertAdminError(when, 400, 'bad date');
  assert.equal(when.json.error.param, 'expires_at');
  assert.match(when.json.error.message, /ISO 8601/);

  // A tenant with a ledger (its top-up) cannot be deleted: the answer says to suspend it.
  assert.equal((await admin.post(`/tenants/${t.id}/topup`, { amount: '2' })).status, 200);
  const del = await admin.del(`/tenants/${t.id}`);
  assertAdminError(del, 409, 'delete a tenant with a ledger');
  assert.equal(del.json.error.code, 'in_use');
  assert.match(del.json.error.message, /cannot be deleted: suspend it instead/);
  assert.ok(!/fkey|foreign key/.test(del.json.error.message));

  // Validation errors name their field in "param" too.
  const bad = await admin.post('/accounts', { name: 'x', provider: 'openai', base_url: 'http://' });
  assert.equal(bad.json.error.param, 'base_url');
});

test('the ledger: newest first, paged by before, filtered by tenant and kind; bad parameters are 400s', async () => {
  const a = await admin.create('/tenants', { name: 'ledger-a' });
  const b = await admin.create('/tenants', { name: 'ledger-b' });
  for (let i = 1; i <= 5; i++) assert.equal((await admin.post(`/tenants/${a.id}/topup`, { amount: `${i}.000117`, note: `inv ${i}` })).status, 200);
  assert.equal((await admin.post(`/tenants/${b.id}/topup`, { amount: '9' })).status, 200);
  const p1 = await admin.read(`/ledger?tenant_id=${a.id}&limit=2`);
  assert.deepEqual(p1.data.map((r) => r.note), ['inv 5', 'inv 4']);
  assert.equal(p1.has_more, true);
  assert.equal(p1.data[0].tenant, 'ledger-a');
  assert.equal(p1.data[0].kind, 'topup');
  assert.equal(String(p1.data[0].amount), '5.000117', 'the amount as stored');
  const p2 = await admin.read(`/ledger?tenant_id=${a.id}&limit=2&before=${p1.next_before}`);
  assert.deepEqual(p2.data.map((r) => r.note), ['inv 3', 'inv 2']);
  const p3 = await admin.read(`/ledger?tenant_id=${a.id}&limit=2&before=${p2.next_before}`);
  assert.deepEqual(p3.data.map((r) => r.note), ['inv 1']);
  assert.equal(p3.has_more, false);
  const all = await admin.read('/ledger?kind=topup&limit=500');
  assert.ok(all.data.some((r) => r.tenant === 'ledger-b'));
  assert.ok(all.data.every((r) => r.kind === 'topup'));
  for (const q of ['limit=0', 'limit=501', 'limit=x', 'before=-1', 'tenant_id=abc', 'kind=refund']) {
    assertAdminError(await admin.get(`/ledger?${q}`), 400, q);
  }
  assertAdminError(await admin.post('/ledger', {}), 405, 'POST ledger');
  assertAdminError(await admin.del('/ledger'), 405, 'DELETE ledger');
  assert.equal((await admin.get('/ledger')).status, 200, 'the worker is still up');
});

test('refusals are counted by reason in /metrics (tollgate_refusals_total), upstream answers are not', async () => {
  const before = await metrics(gw);
  const n = (m, code) => m[`tollgate_refusals_total{code="${code}"}`] ?? 0;
  assert.equal((await chat(gw, 'tg-no-such-key', chatReq(MODEL))).status, 401);
  assert.equal((await chat(gw, 'tg-no-such-key', chatReq(MODEL))).status, 401);
  const after = await metrics(gw);
  assert.equal(n(after, 'invalid_api_key') - n(before, 'invalid_api_key'), 2, JSON.stringify(after));
  // An upstream's own refusal relayed to the client is not the gateway's.
  const total = (m) => Object.entries(m).filter(([k]) => k.startsWith('tollgate_refusals_total')).reduce((a, [, v]) => a + v, 0);
  const r = await chat(gw, 'tg-test-key', chatReq(MODEL, 'hi [mock status=400]'));
  assert.equal(r.status, 400, r.text);
  assert.equal(total(await metrics(gw)), total(after));
});
