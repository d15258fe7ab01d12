// `tollgate apply -c CFG STATE.lua [--dry-run]`: the declarative, idempotent upsert of
// tenants, groups, accounts, keys and prices. The first run creates every row and says
// so; the same file again changes nothing; --dry-run prints what it would do and writes
// nothing; an edited file updates just what changed ("~ table name: columns"); a running
// gateway sees what apply wrote at once (apply publishes the invalidation).

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { chat, chatReq, createDb, plainKey, sha256hex, startStateGateway, stateFile, tool } from './lib/db.mjs';

let db;
let mock;
const KEY = plainKey('apply');
const LATE_KEY = plainKey('late');
const CRED = `sk-apply-${Date.now()}`;

function baseState() {
  return {
    tenants: [
      { name: 'acme', balance: '100.00' },
      { name: 'globex', balance: '5', budget: '50' },
    ],
    groups: [{ name: 'g-acme', models: [MODEL], rate_multiplier: 1 }],
    accounts: [{
      name: 'acct-acme', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED,
      concurrency: 8, priority: 1, groups: ['g-acme'],
    }],
    keys: [{ name: 'k1', tenant: 'acme', group: 'g-acme', key: KEY, rpm: 600, concurrency: 4 }],
    prices: [{ model: MODEL, input: '0.15', output: '0.60', cache_read: '0.075' }],
  };
}

before(async () => {
  mock = await startMock();
  db = await createDb();
});

after(async () => {
  await stopAll();
  await db?.drop();
});

const counts = async () => db.query(
  'SELECT (SELECT count(*) FROM tenants) AS tenants, (SELECT count(*) FROM groups) AS groups, ' +
  '(SELECT count(*) FROM accounts) AS accounts, (SELECT count(*) FROM api_keys) AS keys, ' +
  '(SELECT count(*) FROM model_prices) AS prices, (SELECT count(*) FROM account_groups) AS memberships, ' +
  '(SELECT count(*) FROM ledger) AS ledger');

test('--dry-run on an empty database prints what it would create and writes nothing', async () => {
  const r = await tool(['apply', stateFile(baseState()), '--dry-run'], { db });
  assert.equal(r.code, 0, r.stderr);
  for (const l of ['+ tenants acme', '+ tenants globex', '+ groups g-acme', '+ accounts acct-acme', '+ api_keys acme/k1', `+ model_prices ${MODEL}`]) {
    assert.ok(r.stdout.split('\n').includes(l), `dry run lists "${l}":\n${r.stdout}`);
  }
  assert.match(r.stdout, /dry run \(nothing written\): 6 created, 0 updated, 0 unchanged/);
  assert.deepEqual(await counts(), [{ tenants: 0, groups: 0, accounts: 0, keys: 0, prices: 0, memberships: 0, ledger: 0 }]);
});

test('the first apply creates every row; the key is stored as its SHA-256, the credential sealed', async () => {
  const r = await tool(['apply', stateFile(baseState())], { db });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /applied: 6 created, 0 updated, 0 unchanged/);
  assert.deepEqual(await counts(), [{ tenants: 2, groups: 1, accounts: 1, keys: 1, prices: 1, memberships: 1, ledger: 2 }]);
  const [k] = await db.query("SELECT encode(key_hash, 'hex') AS h, prefix, rpm, concurrency, status FROM api_keys");
  assert.equal(k.h, sha256hex(KEY));
  assert.equal(k.prefix, KEY.slice(0, 8));
  assert.equal(k.rpm, 600);
  assert.equal(k.concurrency, 4);
  assert.equal(k.status, 'active');
  const [t] = await db.query("SELECT balance::text, opening_balance::text FROM tenants WHERE name = 'acme'");
  assert.equal(Number(t.balance), 100);
  assert.equal(Number(t.opening_balance), 100);
  const [a] = await db.query("SELECT encode(credential, 'escape') AS c, length(credential) AS n FROM accounts");
  assert.ok(!a.c.includes(CRED), 'the credential is not stored in the clear');
  assert.ok(a.n > CRED.length, 'sealed: nonce + ciphertext + tag');
});

test('the same file again changes nothing and prints only the summary', async () => {
  const before = await db.query('SELECT id, updated_at FROM tenants UNION ALL SELECT id, updated_at FROM api_keys UNION ALL SELECT id, updated_at FROM accounts ORDER BY 1');
  const r = await tool(['apply', stateFile(baseState())], { db });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /applied: 0 created, 0 updated, 6 unchanged/);
  assert.doesNotMatch(r.stdout, /^[+~] /m, `no change lines:\n${r.stdout}`);
  const afterRows = await db.query('SELECT id, updated_at FROM tenants UNION ALL SELECT id, updated_at FROM api_keys UNION ALL SELECT id, updated_at FROM accounts ORDER BY 1');
  assert.deepEqual(afterRows, before, 'no row was rewritten');
});

test('a change shows "~ ..." in a dry run without writing it, then applies it', async () => {
  const s = baseState();
  s.tenants[0].budget = '75.50';
  s.keys[0].rpm = 120;
  s.groups[0].models = [MODEL, 'other-model'];
  const dry = await tool(['apply', stateFile(s), '--dry-run'], { db });
  assert.equal(dry.code, 0, dry.stderr);
  const lines = dry.stdout.split('\n');
  assert.ok(lines.some((l) => /^~ tenants acme: .*budget/.test(l)), dry.stdout);
  assert.ok(lines.some((l) => /^~ api_keys acme\/k1: .*rpm/.test(l)), dry.stdout);
  assert.ok(lines.some((l) => /^~ groups g-acme: .*models/.test(l)), dry.stdout);
  assert.match(dry.stdout, /dry run \(nothing written\): 0 created, 3 updated/);
  assert.equal(await db.scalar("SELECT budget IS NULL FROM tenants WHERE name = 'acme'"), 't', 'dry run wrote nothing');
  assert.equal(await db.scalar('SELECT rpm FROM api_keys'), '600');

  const real = await tool(['apply', stateFile(s)], { db });
  assert.equal(real.code, 0, real.stderr);
  assert.match(real.stdout, /applied: 0 created, 3 updated/);
  assert.equal(Number(await db.scalar("SELECT budget FROM tenants WHERE name = 'acme'")), 75.5);
  assert.equal(await db.scalar('SELECT rpm FROM api_keys'), '120');
  // The opening balance is used on creation only: it did not move.
  assert.equal(Number(await db.scalar("SELECT balance FROM tenants WHERE name = 'acme'")), 100);

  const again = await tool(['apply', stateFile(s)], { db });
  assert.match(again.stdout, /applied: 0 created, 0 updated/);
});

test('a changed credential is re-sealed and reported; an unchanged one is not', async () => {
  const s = baseState();
  s.tenants[0].budget = '75.50';
  s.keys[0].rpm = 120;
  s.groups[0].models = [MODEL, 'other-model'];
  s.accounts[0].credential = `${CRED}-rotated`;
  const before = await db.scalar("SELECT encode(credential, 'hex') FROM accounts");
  const r = await tool(['apply', stateFile(s)], { db });
  assert.equal(r.code, 0, r.stderr);
  assert.ok(r.stdout.split('\n').includes('~ accounts acct-acme: credential'), r.stdout);
  assert.notEqual(await db.scalar("SELECT encode(credential, 'hex') FROM accounts"), before);
  const again = await tool(['apply', stateFile(s)], { db });
  assert.match(again.stdout, /applied: 0 created, 0 updated/);
});

test('a bad state file is refused with a message naming the place, and nothing is written', async () => {
  const before = await counts();
  const s = baseState();
  s.tenants.push({ name: 'initech' });
  s.keys.push({ name: 'k2', tenant: 'no-such-tenant', key: plainKey('bad') });
  const r = await tool(['apply', stateFile(s)], { db });
  assert.notEqual(r.code, 0, r.stdout);
  assert.match(r.stderr, /keys\[2\]/, r.stderr);
  assert.match(r.stderr, /no-such-tenant/);
  assert.deepEqual(await counts(), before, 'one transaction: initech was not created either');

  const unknown = await tool(['apply', stateFile({ tenant: [{ name: 'typo' }] })], { db });
  assert.notEqual(unknown.code, 0);
  assert.match(unknown.stderr, /unknown section "tenant"/);
});

test('an unknown field in an item is refused, naming it, and nothing is written', async () => {
  const before = await counts();
  for (const [section, item] of [
    ['keys', { name: 'k9', tenant: 'acme', key: plainKey('typo'), concurency: 5 }],
    ['tenants', { name: 'typo-tenant', balanse: '10' }],
    ['accounts', { name: 'typo-acct', provider: 'openai', base_url: `${mock.url}/v1`, group: ['g-acme'] }],
  ]) {
    const s = baseState();
    s[section].push(item);
    const r = await tool(['apply', stateFile(s)], { db });
    const field = Object.keys(item).find((k) => ['concurency', 'balanse', 'group'].includes(k));
    assert.notEqual(r.code, 0, `${section}: a typo "${field}" must not be ignored silently:\n${r.stdout}`);
    assert.match(r.stderr, new RegExp(field), `${section}: the message names "${field}"`);
  }
  assert.deepEqual(await counts(), before);
});

test('a running gateway serves a key as soon as apply creates it', async () => {
  const gw = await startStateGateway(db, {}, { mock });
  // Unknown first: the gateway caches the miss (a negative entry).
  const r0 = await chat(gw, LATE_KEY, chatReq(MODEL));
  assert.equal(r0.status, 401);
  assert.equal(r0.json?.error?.code, 'invalid_api_key');
  const s = baseState();
  s.keys.push({ name: 'late', tenant: 'globex', group: 'g-acme', key: LATE_KEY });
  const applied = await tool(['apply', stateFile(s)], { db });
  assert.equal(applied.code, 0, applied.stderr);
  const t0 = Date.now();
  const ok = await waitFor(async () => (await chat(gw, LATE_KEY, chatReq(MODEL))).status === 200,
    { timeout: 3000, interval: 50, what: 'the applied key to be accepted' });
  assert.ok(ok);
  // Well under the 5 s a negative entry lives: apply told the gateway.
  assert.ok(Date.now() - t0 < 1500, `accepted after ${Date.now() - t0} ms`);
  const stats = await mock.stats();
  assert.ok(stats.credentials[CRED] || stats.credentials[`${CRED}-rotated`], `the account's credential was used upstream: ${JSON.stringify(stats.credentials)}`);
});
