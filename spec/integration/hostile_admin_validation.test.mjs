// Header injection through account fields (issue "hostile", item 6): an account's
// base_url and credential end up in the upstream request line and headers, so a CR/LF
// in them would add headers (or whole requests) of the attacker's choosing. The admin
// API and `tollgate apply` refuse such values (400 / exit 1, naming the field, nothing
// written); values that reach the database some other way are refused again when the
// accounts are loaded, so the mock upstream never sees an injected header.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';

import { stopAll } from './lib/harness.mjs';
import { startMock } from './lib/harness.mjs';
import {
  SECRET_KEY, adminClient, applyState, chat, chatReq, createDb, plainKey, startStateGateway, stateFile, tool,
} from './lib/db.mjs';

const MODEL = 'gpt-4o-mini';
const KEY = plainKey('hv');
const RAW_KEY = plainKey('raw');
const LIMITED_KEY = plainKey('lim');
const CRED = 'sk-upstream-good';
let db;
let mock;
let gw;
let admin;

function baseState() {
  return {
    tenants: [{ name: 'acme', balance: '100' }],
    groups: [{ name: 'main' }, { name: 'raw' }],
    accounts: [{ name: 'good', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, groups: ['main'] }],
    keys: [
      { name: 'k', tenant: 'acme', group: 'main', key: KEY },
      { name: 'raw-k', tenant: 'acme', group: 'raw', key: RAW_KEY },
      { name: 'limited', tenant: 'acme', group: 'main', key: LIMITED_KEY, rpm: 1, rpm_burst: 1 },
    ],
  };
}

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, baseState());
  gw = await startStateGateway(db, {}, { mock });
  admin = adminClient(gw);
});

after(async () => {
  await stopAll();
  await db?.drop();
});

/** Every header the mock saw on its latest request (lowercased names). */
async function lastHeaders() {
  return (await mock.last()).headers ?? {};
}

function assertNoInjected(headers, where) {
  for (const name of Object.keys(headers)) assert.ok(!/injected|evil/i.test(name), `${where}: the upstream saw header ${name}`);
  for (const [name, v] of Object.entries(headers)) assert.ok(!/injected|evil/i.test(String(v)), `${where}: ${name}: ${v}`);
}

function assert400(r, field, what) {
  assert.equal(r.status, 400, `${what}: ${r.status} ${r.text}`);
  assert.equal(typeof r.json?.error?.message, 'string', `${what}: ${r.text}`);
  assert.ok(r.json.error.message.includes(`"${field}"`), `${what}: the error names ${field}: ${r.json.error.message}`);
}

const INJECT = '\r\nX-Injected: 1';

test('the admin API refuses CR/LF and malformed URLs in every header-bound account field, naming it', async () => {
  const accounts = await db.scalar('SELECT count(*) FROM accounts');
  const base = { name: 'evil', provider: 'openai', base_url: `${mock.url}/v1`, groups: [] };
  const cases = [
    ['base_url', { ...base, base_url: `${mock.url}/v1${INJECT}` }],
    ['base_url', { ...base, base_url: `${mock.url}/v1\nX-Injected: 1` }],
    ['base_url', { ...base, base_url: `${mock.url}/v1 HTTP/1.1\r\nX-Injected: 1\r\n\r\nGET /evil` }],
    ['base_url', { ...base, base_url: `${mock.url}/v1 x` }],
    ['base_url', { ...base, base_url: 'http:///v1' }],
    ['base_url', { ...base, base_url: 'http://evil@127.0.0.1:1/v1' }],
    ['base_url', { ...base, base_url: `${mock.url}/v1?x=1` }],
    ['base_url', { ...base, base_url: `${mock.url}/v1#frag` }],
    ['base_url', { ...base, base_url: 'http://127.0.0.1:99999/v1' }],
    ['base_url', { ...base, base_url: 'javascript:alert(1)' }],
    ['credential', { ...base, credential: `sk-1${INJECT}` }],
    ['model_map', { ...base, model_map: { 'gpt-4o-mini': `gpt-4o${INJECT}` } }],
    ['model_map', { ...base, model_map: { [`gpt${INJECT}`]: 'gpt-4o' } }],
    ['model_map', { ...base, model_map: { 'gpt-4o-mini': 42 } }],
    ['models', { ...base, models: [`gpt-4o${INJECT}`] }],
    ['name', { ...base, name: `evil${INJECT}` }],
  ];
  for (const [field, body] of cases) assert400(await admin.post('/accounts', body), field, `POST ${JSON.stringify(body)}`);
  assert.equal(await db.scalar('SELECT count(*) FROM accounts'), accounts, 'nothing was written');

  // An update of the existing account is refused the same way and changes nothing.
  const id = await db.scalar("SELECT id FROM accounts WHERE name = 'good'");
  const before = await db.scalar(`SELECT base_url || encode(credential, 'hex') FROM accounts WHERE id = ${id}`);
  assert400(await admin.patch(`/accounts/${id}`, { credential: `sk-2${INJECT}` }), 'credential', 'PATCH credential');
  assert400(await admin.patch(`/accounts/${id}`, { base_url: `${mock.url}${INJECT}` }), 'base_url', 'PATCH base_url');
  assert.equal(await db.scalar(`SELECT base_url || encode(credential, 'hex') FROM accounts WHERE id = ${id}`), before);

  // Names, emails and lists of other resources: no control characters either.
  assert400(await admin.post('/tenants', { name: `t${INJECT}` }), 'name', 'tenant name');
  assert400(await admin.post('/groups', { name: `g\u0007` }), 'name', 'group name');
  assert400(await admin.post('/groups', { name: 'g-ok', models: ['a\nb'] }), 'models', 'group models');
  const tenant = await db.scalar("SELECT id FROM tenants WHERE name = 'acme'");
  assert400(await admin.post('/users', { tenant_id: Number(tenant), email: `a@b${INJECT}` }), 'email', 'user email');
  assert400(await admin.post('/keys', { tenant_id: Number(tenant), name: `k${INJECT}` }), 'name', 'key name');
  assert400(await admin.post('/prices', { model: `m${INJECT}`, input: '1' }), 'model', 'price model');

  // Clean values still pass.
  const ok = await admin.post('/accounts', { ...base, name: 'clean', base_url: `${mock.url}/v1/`, credential: 'sk-clean', model_map: { a: 'b' } });
  assert.equal(ok.status, 201, ok.text);
  assert.equal((await admin.del(`/accounts/${ok.json.id}`)).status, 204);

  // The data plane still works and the upstream saw only clean headers.
  const r = await chat(gw, KEY, chatReq(MODEL));
  assert.equal(r.status, 200, r.text);
  const h = await lastHeaders();
  assert.equal(h.authorization, `Bearer ${CRED}`);
  assertNoInjected(h, 'after the refused writes');
});

test('tollgate apply refuses the same values, naming the field, and writes nothing', async () => {
  const dump = JSON.stringify(await db.query('SELECT name, base_url, credential, model_map FROM accounts ORDER BY id'));
  const variants = [
    ['base_url', (s) => { s.accounts[0].base_url = `${mock.url}/v1${INJECT}`; }],
    ['base_url', (s) => { s.accounts[0].base_url = 'http://user@127.0.0.1/v1'; }],
    ['credential', (s) => { s.accounts[0].credential = `${CRED}${INJECT}`; }],
    ['model_map', (s) => { s.accounts[0].model_map = { a: `b${INJECT}` }; }],
    ['model_map', (s) => { s.accounts[0].model_map = { [`a${INJECT}`]: 'b' }; }],
    ['models', (s) => { s.accounts[0].models = [`m${INJECT}`]; }],
    ['name', (s) => { s.tenants[0].name = `acme${INJECT}`; }],
  ];
  for (const [field, change] of variants) {
    const s = baseState();
    change(s);
    const r = await tool(['apply', stateFile(s)], { db });
    assert.notEqual(r.code, 0, `apply accepted a bad ${field}: ${r.stdout}`);
    assert.match(r.stderr, new RegExp(`apply: [a-z]+\\[1\\]: field "${field}"`), `the error names ${field}: ${r.stderr}`);
    assert.ok(!r.stderr.includes('\r'), 'the message carries no raw CR');
  }
  assert.equal(JSON.stringify(await db.query('SELECT name, base_url, credential, model_map FROM accounts ORDER BY id')), dump);
});

/** AES-256-GCM sealed credential in the format of tg_crypto_seal (1 || nonce || ct || tag). */
function seal(plain) {
  const nonce = crypto.randomBytes(12);
  const c = crypto.createCipheriv('aes-256-gcm', Buffer.from(SECRET_KEY, 'hex'), nonce);
  const ct = Buffer.concat([c.update(plain, 'utf8'), c.final()]);
  return Buffer.concat([Buffer.from([1]), nonce, ct, c.getAuthTag()]).toString('hex');
}

test('values written straight into the database are refused at load: never sent upstream', async () => {
  // As a restore of an old dump or a hand-written SQL statement would leave them.
  const group = await db.scalar("SELECT id FROM groups WHERE name = 'raw'");
  const evilUrl = `${mock.url}/v1 HTTP/1.1\r\nX-Injected: url\r\nX-Evil: 1\r\n\r\nPOST /v1`;
  await db.exec(`INSERT INTO accounts (name, provider, base_url, credential) VALUES
    ('raw-url', 'openai', E'${evilUrl.replace(/\r/g, '\\r').replace(/\n/g, '\\n')}', '\\x${seal(CRED)}'::bytea),
    ('raw-cred', 'openai', '${mock.url}/v1', '\\x${seal(`${CRED}\r\nX-Injected: cred`)}'::bytea)`);
  await db.exec(`INSERT INTO account_groups (account_id, group_id)
    SELECT id, ${group} FROM accounts WHERE name IN ('raw-url', 'raw-cred')`);
  await mock.reset();
  const ids = (await db.query("SELECT id FROM accounts WHERE name IN ('raw-url', 'raw-cred') ORDER BY name")).map((x) => x.id);
  // The gateway reloads its accounts on invalidation; a fresh one loads them at start.
  const gw2 = await startStateGateway(db, {}, { mock });
  for (let i = 0; i < 4; i++) {
    const r = await chat(gw2, RAW_KEY, chatReq(MODEL));
    assert.ok(r.status >= 500 && r.status < 600, `no clean account can serve: ${r.status} ${r.text}`);
    assert.equal(typeof r.json?.error?.message, 'string', r.text);
  }
  const stats = await mock.stats();
  assert.equal(stats.total, 0, `the upstream was called: ${JSON.stringify(stats)}`);
  for (const id of ids) {
    await gw2.proc.waitForLine('stderr', new RegExp(`accounts: account ${id}: (base_url|the credential) contains a control character`), 5000);
  }
  // The clean account of the other group still serves, with clean headers.
  const ok = await chat(gw2, KEY, chatReq(MODEL));
  assert.equal(ok.status, 200, ok.text);
  assertNoInjected(await lastHeaders(), 'the clean account');
  await gw2.stop();
});

test('a limiter refusal on /v1/messages is an Anthropic error the SDK parses; on chat an OpenAI one', async () => {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const client = new Anthropic({ apiKey: LIMITED_KEY, baseURL: gw.url, maxRetries: 0, timeout: 15000 });
  const body = { model: MODEL, max_tokens: 16, messages: [{ role: 'user', content: 'hi [mock chunks=1]' }] };
  const first = await client.messages.create(body);
  assert.equal(first.type, 'message');
  await assert.rejects(client.messages.create(body), (e) => {
    assert.ok(e instanceof Anthropic.RateLimitError, `got ${e?.constructor?.name}: ${e?.message}`);
    assert.equal(e.error?.type, 'error');
    assert.equal(e.error?.error?.type, 'rate_limit_error');
    assert.match(String(e.headers?.get?.('retry-after') ?? e.headers?.['retry-after']), /^[0-9]+$/);
    return true;
  });
  const raw = await chat(gw, LIMITED_KEY, chatReq(MODEL));
  assert.equal(raw.status, 429, raw.text);
  assert.equal(raw.json?.type, undefined);
  assert.equal(typeof raw.json?.error?.code, 'string', raw.text);
});
