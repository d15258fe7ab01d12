// Hostile input on the control plane: the admin API (/admin/api/v1/*) and the console
// (/admin/). Malformed and deep JSON, absurd numbers and money, injection in every
// string that reaches SQL, a header (an account's base URL and credential) or a log,
// path tricks, and login abuse. Each case: status, the admin API's error shape, an
// access-log line, a good request after it still served; at the end ledger verify is
// clean and the tables are intact (spec/hostile/lib.mjs).
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';

import { lit } from '../integration/lib/db.mjs';
import {
  ADMIN_TOKEN, HOST, RawConn, chat, finalChecks, hostileSetup, hostileTeardown, http, rawCase, runCases,
} from './lib.mjs';

let S;
before(async () => {
  S = await hostileSetup();
});
after(() => hostileTeardown(S));

const A = '/admin/api/v1';
const admin = (name, method, p, body, expect, { token = ADMIN_TOKEN, headers = {}, check, todo } = {}) => ({
  name,
  ...expect,
  ...(todo ? { todo } : {}),
  ...(check ? { check } : {}),
  run: async (S2) => {
    const h = { ...headers };
    if (token) h.authorization = `Bearer ${token}`;
    const path = typeof p === 'function' ? p(S2) : p;
    return { res: await http(S2.gw, method, `${A}${path}`, { body: typeof body === 'function' ? body(S2) : body, headers: h }) };
  },
});
const bad = (status = 400) => ({ status, shape: 'admin' });
const deep = (n) => `${'{"a":'.repeat(n)}1${'}'.repeat(n)}`;

/** After a case that created something: the row holds exactly what was sent. */
const storedAs = (table, col, value) => async (o, S2) => {
  if (o.res.status >= 400) return;
  const id = o.res.json?.id;
  assert.ok(id, `created: ${o.res.text}`);
  assert.equal(await S2.db.scalar(`SELECT ${col} = ${lit(value)} FROM ${table} WHERE id = ${Number(id)}`), 't', `${table}.${col} stored as sent`);
};

const INJECT = [
  ['SQL', "x'); DROP TABLE tenants; --"],
  ['quotes and backslashes', 'a"b\'c\\d`e'],
  ['CRLF', 'evil\r\nx-injected: 1'],
  ['a Redis hash tag', '{t:1}:money'],
  ['format specifiers', '%s%n%x%p'],
  ['unicode + RTL override', 'ten\u202Eant😀'],
];

let n = 0;
const uniq = (s) => `${s}-${++n}`;

const cases = [
  // ---- authentication ----
  admin('auth: no token', 'GET', '/tenants', undefined, { ...bad(401) }, { token: null }),
  admin('auth: wrong token', 'GET', '/tenants', undefined, { ...bad(401) }, { token: 'adm-nope' }),
  admin('auth: token prefix', 'GET', '/tenants', undefined, { ...bad(401) }, { token: ADMIN_TOKEN.slice(0, -1) }),
  admin('auth: a data-plane key is not an admin token', 'GET', '/tenants', undefined, { ...bad(401) }, { token: 'x' }),
  admin('auth: Basic scheme', 'GET', '/tenants', undefined, { ...bad(401) }, { token: null, headers: { authorization: `Basic ${Buffer.from(`admin:${ADMIN_TOKEN}`).toString('base64')}` } }),
  admin('auth: 6 KB token', 'GET', '/tenants', undefined, { status: [401, 431], shape: 'admin' }, { token: 'a'.repeat(6000) }),

  // ---- malformed bodies ----
  admin('json: truncated', 'POST', '/tenants', '{"name":"x', bad()),
  admin('json: empty', 'POST', '/tenants', '', bad()),
  admin('json: an array', 'POST', '/tenants', '[]', bad()),
  admin('json: deep (10k)', 'POST', '/tenants', () => `{"name":"${uniq('deep')}","x":${deep(10000)}}`, bad()),
  admin('json: duplicate key', 'POST', '/tenants', () => `{"name":"${uniq('dup')}","name":"${uniq('dup')}"}`, bad()),
  admin('json: invalid UTF-8', 'POST', '/tenants', Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]), bad()),
  admin('json: NUL escape in a name', 'POST', '/tenants', () => ({ name: `nul\u0000${uniq('x')}` }), bad()),
  admin('json: unknown field', 'POST', '/tenants', () => ({ name: uniq('unk'), is_admin: true }), { status: [201, 400], shape: 'admin' }),
  admin('json: name as a number', 'POST', '/tenants', { name: 5 }, bad()),
  admin('json: name 100 KB', 'POST', '/tenants', () => ({ name: 'n'.repeat(100000) }), { status: [201, 400, 413], shape: 'admin' }),

  // ---- money ----
  ...[['1e309'], ['-5'], ['NaN'], ['Infinity'], ['0x10'], ['1,5'], ['']].map(([v]) =>
    admin(`money: opening balance ${JSON.stringify(v)}`, 'POST', '/tenants', () => ({ name: uniq('bal'), balance: v }), bad())),
  admin('money: opening balance below one nano-USD', 'POST', '/tenants', () => ({ name: uniq('baln'), balance: '0.0000000001' }), bad()),
  admin('money: opening balance 1e-10 as a JSON number', 'POST', '/tenants', () => `{"name":"${uniq('baln')}","balance":1e-10}`, bad()),
  admin('money: key budget below one nano-USD', 'POST', '/keys', (S2) => ({ name: uniq('key'), tenant_id: S2.tenantId, budget: '5.0000000001' }), bad()),
  admin('money: top-up 1e-10 as a JSON number', 'POST', (S2) => `/tenants/${S2.qTenantId}/topup`, '{"amount":1e-10}', bad()),
  admin('money: opening balance as a float number', 'POST', '/tenants', () => ({ name: uniq('balf'), balance: 0.1 }), { status: [201, 400], shape: 'admin' }),
  ...[['-5'], ['0'], ['NaN'], ['1e309'], ['abc']].map(([v]) =>
    admin(`money: top-up ${JSON.stringify(v)}`, 'POST', (S2) => `/tenants/${S2.tenantId}/topup`, { amount: v }, bad())),
  admin('money: top-up below one nano-USD', 'POST', (S2) => `/tenants/${S2.qTenantId}/topup`, { amount: '0.0000000001' }, bad()),
  admin('money: top-up 10^30', 'POST', (S2) => `/tenants/${S2.qTenantId}/topup`, { amount: `1${'0'.repeat(30)}` }, bad()),
  admin('money: top-up 2^63 nano-USD', 'POST', (S2) => `/tenants/${S2.qTenantId}/topup`, { amount: '9223372036.854775808' }, bad()),
  admin('money: top-up as a JSON number 1e308', 'POST', (S2) => `/tenants/${S2.qTenantId}/topup`, '{"amount":1e308}', bad()),
  admin('money: top-up of an unknown tenant', 'POST', '/tenants/999999999999/topup', { amount: '1' }, { status: [400, 404], shape: 'admin' }),
  admin('money: price -1', 'POST', '/prices', () => ({ model: uniq('m'), input: '-1', output: '1' }), bad()),
  admin('money: price 1e309', 'POST', '/prices', () => ({ model: uniq('m'), input: '1e309', output: '1' }), bad()),

  // ---- ids and query strings ----
  admin('id: not a number', 'GET', '/tenants/abc', undefined, { status: [400, 404], shape: 'admin' }),
  admin('id: negative', 'GET', '/tenants/-1', undefined, { status: [400, 404], shape: 'admin' }),
  admin('id: 2^64', 'GET', '/tenants/18446744073709551616', undefined, { status: [400, 404], shape: 'admin' }),
  admin('id: SQL', 'GET', "/tenants/1%20OR%201=1", undefined, { status: [400, 404], shape: 'admin' }),
  admin('id: %00', 'GET', '/tenants/1%00', undefined, { status: [400, 404], shape: 'admin' }),
  admin('query: model SQL', 'GET', "/usage?model=x'%20OR%20'1'='1", undefined, { status: 200, check: (o) => assert.deepEqual(o.res.json?.data ?? o.res.json?.usage ?? [], []) }),
  admin('query: bad date', 'GET', '/usage?from=yesterday%27--', undefined, bad()),
  admin('query: tenant_id 1e309', 'GET', '/usage?tenant_id=1e309', undefined, bad()),
  admin('query: group_by injection', 'GET', '/usage/summary?group_by=model;DROP%20TABLE%20usage', undefined, bad()),
  admin('query: 4 KB of %-escapes', 'GET', `/usage?model=${'%ff'.repeat(1300)}`, undefined, { status: [200, 400], shape: 'admin' }),
  admin('route: unknown', 'GET', '/nope', undefined, { status: 404, shape: 'admin' }),
  admin('route: dot segments', 'GET', '/../../../etc/passwd', undefined, { status: [400, 404], shape: 'admin', check: (o) => assert.ok(!/root:/.test(o.res.text)) }),
  admin('route: wrong method', 'PUT', '/tenants', {}, { status: [404, 405], shape: 'admin' }),

  // ---- accounts: strings that become upstream headers and URLs ----
  admin('account: base_url with CRLF', 'POST', '/accounts', () => ({ name: uniq('acc'), provider: 'openai', base_url: 'http://127.0.0.1:9/v1\r\nx-injected: 1', credential: 'sk-x', groups: [] }), bad()),
  admin('account: credential with CRLF', 'POST', '/accounts', () => ({ name: uniq('acc'), provider: 'openai', base_url: 'http://127.0.0.1:9/v1', credential: 'sk-x\r\nx-injected: 1', groups: [] }), bad()),
  admin('account: base_url file://', 'POST', '/accounts', () => ({ name: uniq('acc'), provider: 'openai', base_url: 'file:///etc/passwd', credential: 'sk-x', groups: [] }), bad()),
  // Accepted today (201): the URL is only parsed when the account is first used, where
  // it fails as a connect error. Refusing it at write time would be better; see the
  // hostile-suite report.
  admin('account: base_url not a URL', 'POST', '/accounts', () => ({ name: uniq('acc'), provider: 'openai', base_url: 'http://[::1', credential: 'sk-x', groups: [] }), { status: [201, 400], shape: 'admin' }),
  admin('account: unknown provider', 'POST', '/accounts', () => ({ name: uniq('acc'), provider: 'evil', base_url: 'http://127.0.0.1:9/v1', credential: 'sk-x', groups: [] }), bad()),
  admin('account: concurrency -1', 'POST', '/accounts', () => ({ name: uniq('acc'), provider: 'openai', base_url: 'http://127.0.0.1:9/v1', credential: 'sk-x', concurrency: -1, groups: [] }), bad()),
  admin('account: concurrency 1e309', 'POST', '/accounts', () => `{"name":"${uniq('acc')}","provider":"openai","base_url":"http://127.0.0.1:9/v1","credential":"sk-x","concurrency":1e309,"groups":[]}`, bad()),

  // ---- keys and groups: numbers the limiter reads ----
  admin('key: rpm -1', 'POST', '/keys', (S2) => ({ name: uniq('key'), tenant_id: S2.tenantId, rpm: -1 }), bad()),
  admin('key: rpm 2^63', 'POST', '/keys', (S2) => `{"name":"${uniq('key')}","tenant_id":${S2.tenantId},"rpm":9223372036854775808}`, bad()),
  admin('key: tpm "x"', 'POST', '/keys', (S2) => ({ name: uniq('key'), tenant_id: S2.tenantId, tpm: 'x' }), bad()),
  admin('key: budget -1', 'POST', '/keys', (S2) => ({ name: uniq('key'), tenant_id: S2.tenantId, budget: '-1' }), bad()),
  admin('key: allowed model list of 10k entries', 'POST', '/keys', (S2) => ({ name: uniq('key'), tenant_id: S2.tenantId, models: Array.from({ length: 10000 }, (_, i) => `m${i}`) }), { status: [201, 400, 413], shape: 'admin' }),
  admin('group: rate_multiplier -1', 'POST', '/groups', () => ({ name: uniq('grp'), rate_multiplier: -1 }), bad()),
  admin('group: rate_multiplier 1e309', 'POST', '/groups', () => `{"name":"${uniq('grp')}","rate_multiplier":1e309}`, bad()),
  admin('group: plugin name with a path', 'POST', '/groups', () => ({ name: uniq('grp'), plugins: { '../../etc/passwd': { config: {} } } }), bad()),
  admin('group: plugin config 10k deep', 'POST', '/groups', () => `{"name":"${uniq('grp')}","plugins":{"model-map":{"config":${deep(10000)}}}}`, bad()),
];

// Injection in names: stored byte for byte (or refused), never executed.
for (const [what, value] of INJECT) {
  cases.push(admin(`inject: tenant name with ${what}`, 'POST', '/tenants', { name: value }, { status: [201, 400, 409], shape: 'admin', check: storedAs('tenants', 'name', value) }));
  cases.push(admin(`inject: price model with ${what}`, 'POST', '/prices', { model: value, input: '1', output: '1' }, {
    status: [201, 400, 409], shape: 'admin',
    check: async (o, S2) => {
      if (o.res.status >= 400) return;
      assert.equal(await S2.db.scalar(`SELECT count(*) FROM model_prices WHERE model = ${lit(value)}`), '1');
    },
  }));
}

// ---- the console ----
const consoleCase = (name, method, p, body, expect, headers = {}) => ({
  name,
  ...expect,
  run: async (S2) => ({ res: await http(S2.gw, method, p, { body, headers }) }),
});
cases.push(
  consoleCase('console: login with truncated JSON', 'POST', '/admin/login', '{"token":', bad()),
  consoleCase('console: login with a number token', 'POST', '/admin/login', { token: 5 }, bad()),
  consoleCase('console: login with a 200 KB token', 'POST', '/admin/login', { token: 'x'.repeat(200000) }, { status: [400, 401, 413], shape: 'admin' }),
  consoleCase('console: login with a NUL in the token', 'POST', '/admin/login', { token: `${ADMIN_TOKEN}\u0000` }, { status: [400, 401], shape: 'admin' }),
  consoleCase('console: login from another origin', 'POST', '/admin/login', { token: ADMIN_TOKEN }, { status: 403, shape: 'admin' }, { origin: 'http://evil.example' }),
  consoleCase('console: wrong token', 'POST', '/admin/login', { token: 'nope' }, { status: 401, shape: 'admin' }),
  consoleCase('console: session with a garbage cookie', 'GET', '/admin/session', undefined, { status: 401, shape: 'admin' }, { cookie: 'tg_session=%00%0d%0a; x=' }),
  consoleCase('console: session with a 7 KB cookie', 'GET', '/admin/session', undefined, { status: [401, 431], shape: 'admin' }, { cookie: `tg_session=${'a'.repeat(7000)}` }),
  consoleCase('console: logout without CSRF', 'POST', '/admin/logout', '', { status: [200, 204, 401, 403] }),
  consoleCase('console: dot segments', 'GET', '/admin/../../../../etc/passwd', undefined, {
    status: [200, 400, 404],
    check: (o) => assert.ok(!/root:x:0/.test(o.res.text), 'no file from outside the console'),
  }),
  consoleCase('console: encoded dot segments', 'GET', '/admin/%2e%2e/%2e%2e/%2e%2e/etc/passwd', undefined, {
    status: [200, 400, 404],
    check: (o) => assert.ok(!/root:x:0/.test(o.res.text), 'no file from outside the console'),
  }),
  consoleCase('console: a missing asset', 'GET', '/admin/assets/nope.js', undefined, { status: 404 }),
  consoleCase('console: POST to a page', 'POST', '/admin/tenants', '{}', { status: 405, shape: 'admin' }),
  rawCase('console: request line with a CRLF-encoded path', () => Buffer.from('GET /admin/%0d%0aSet-Cookie:%20x=1 HTTP/1.1\r\nhost: x\r\n\r\n'), {
    status: [200, 404],
    check: (o) => assert.ok(!o.res.rawHeaders.some(([k, v]) => k === 'set-cookie' && /x=1/.test(v)), 'no injected cookie'),
  }),
);

runCases(() => S, cases);

test('console lockout is per address: failed logins from 127.0.0.2 do not lock out 127.0.0.1', async () => {
  // 25 wrong tokens from 127.0.0.2 (the limit is 20 a minute).
  for (let i = 0; i < 25; i++) {
    const c = new RawConn(net.connect({ port: S.gw.port, host: HOST, localAddress: '127.0.0.2' }));
    await new Promise((resolve, reject) => {
      c.sock.once('connect', resolve);
      c.sock.once('error', reject);
    });
    const b = JSON.stringify({ token: `wrong-${i}` });
    await c.write(`POST /admin/login HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${b.length}\r\nconnection: close\r\n\r\n${b}`);
    const r = await c.response(5000);
    c.destroy();
    assert.ok([401, 429].includes(r?.status), `wrong login ${i}: ${r?.status}`);
  }
  const ok = await http(S.gw, 'POST', '/admin/login', { body: { token: ADMIN_TOKEN } });
  assert.equal(ok.status, 200, `a login from another address still works: ${ok.text}`);
});

test('after the hostile admin input: the data plane serves and the admin API lists', async () => {
  const r = await http(S.gw, 'POST', '/v1/chat/completions', { key: S.key, body: chat('after admin [mock chunks=1]') });
  assert.equal(r.status, 200);
  const t = await http(S.gw, 'GET', `${A}/tenants`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  assert.equal(t.status, 200, t.text);
});

test('the end: ledger verify is clean, tables intact, gateway up', async () => {
  await finalChecks(S);
});
