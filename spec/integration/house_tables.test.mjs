// One description of each table (issue #16, house item 2e): the admin API and
// `tollgate apply` take a table's columns, types and checks from core/src/app/tg_tables.c,
// so a value one refuses the other refuses too, with the same message (apply's line is
// "apply: <section>[<n>]: " and the admin API's message). Before, each had its own
// description: apply let a wrong status, a negative limit, an out-of-range priority or a
// sub-nano budget through to Postgres (a constraint error, or a stored value the admin
// API refuses) and worded the refusals it did make its own way.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';

import { REPO, startMock, stopAll } from './lib/harness.mjs';
import { adminClient, applyState, createDb, startStateGateway, stateFile, tool, toolConfig } from './lib/db.mjs';

const PLUGINS = { dirs: [path.join(REPO, 'plugins')], watch: false };
let db;
let gw;
let admin;
let tenantId;
let cfg;

before(async () => {
  const mock = await startMock();
  db = await createDb();
  await applyState(db, { tenants: [{ name: 'acme', balance: '10' }] });
  tenantId = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  gw = await startStateGateway(db, { plugins: PLUGINS }, { mock });
  admin = adminClient(gw);
  cfg = toolConfig({ plugins: PLUGINS });
});

after(async () => {
  await stopAll();
  await db?.drop();
});

const ACCOUNT = { name: 'acct', provider: 'openai', base_url: 'http://127.0.0.1:9/v1' };

// [section, the item in the admin API's JSON (keys: tenant_id), the same in the state file (keys: tenant)]
const CASES = [
  ['tenants', { name: 't1', status: 'frozen' }],
  ['tenants', { name: 't2', rpm: -1 }],
  ['tenants', { name: 't3', budget: '0.0000000001' }],
  ['tenants', { name: 't4', balance: '1000000000.5' }],
  ['tenants', { name: 't5\r\nX-Injected: 1' }],
  ['tenants', { name: '' }],
  ['groups', { name: 'g1', models: ['ok', 'a\nb'] }],
  ['groups', { name: 'g2', rate_multiplier: '-1' }],
  ['groups', { name: 'g3', plugins: { 'nope-plugin': {} } }],
  ['accounts', { ...ACCOUNT, base_url: 'http://user@127.0.0.1/v1' }],
  ['accounts', { ...ACCOUNT, provider: 'cohere' }],
  ['accounts', { ...ACCOUNT, priority: 2147483648 }],
  ['accounts', { ...ACCOUNT, model_map: { 'gpt-4o': 42 } }],
  ['accounts', { ...ACCOUNT, credential: 'sk-1\r\nX-Injected: 1' }],
  ['accounts', { name: 'acct', base_url: 'http://127.0.0.1:9/v1' }],
  ['keys', { name: 'k1', rpm: 1.5 }],
  ['keys', { name: 'k2', status: 'paused' }],
  ['keys', { name: 'k3', allowed_models: [''] }],
  ['prices', { model: 'm1', input: '1000000001' }],
  ['prices', { model: 'm2', output: 'cheap' }],
];

test('the admin API and tollgate apply refuse the same values with the same message', async () => {
  const before = await db.query('SELECT (SELECT count(*) FROM tenants) t, (SELECT count(*) FROM groups) g, ' +
    '(SELECT count(*) FROM accounts) a, (SELECT count(*) FROM api_keys) k, (SELECT count(*) FROM model_prices) p');
  for (const [section, item] of CASES) {
    const what = `${section} ${JSON.stringify(item)}`;
    const r = await admin.post(`/${section}`, section === 'keys' ? { ...item, tenant_id: tenantId } : item);
    assert.equal(r.status, 400, `admin API, ${what}: ${r.text}`);
    assert.equal(r.json.error.code, 'invalid_request', what);
    const message = r.json.error.message;
    const fileItem = section === 'keys' ? { ...item, tenant: 'acme' } : item;
    const a = await tool(['apply', stateFile({ [section]: [fileItem] })], { db, config: cfg });
    assert.notEqual(a.code, 0, `apply, ${what}: accepted\n${a.stdout}`);
    assert.equal(a.stderr.trim(), `apply: ${section}[1]: ${message}`, `apply, ${what}`);
  }
  const afterCounts = await db.query('SELECT (SELECT count(*) FROM tenants) t, (SELECT count(*) FROM groups) g, ' +
    '(SELECT count(*) FROM accounts) a, (SELECT count(*) FROM api_keys) k, (SELECT count(*) FROM model_prices) p');
  assert.deepEqual(afterCounts, before, 'neither path wrote anything');
});

test('a value both accept is written the same by both', async () => {
  const item = { name: 'same', status: 'suspended', rpm: 10, budget: '12.5', concurrency: 0 };
  const r = await admin.post('/tenants', item);
  assert.equal(r.status, 201, r.text);
  const viaAdmin = await db.query("SELECT status, rpm, budget, concurrency FROM tenants WHERE name = 'same'");
  assert.equal((await admin.del(`/tenants/${r.json.id}`)).status, 204);
  await applyState(db, { tenants: [item] }, { config: cfg });
  const viaApply = await db.query("SELECT status, rpm, budget, concurrency FROM tenants WHERE name = 'same'");
  assert.deepEqual(viaApply, viaAdmin);
});
