// newcomer: spec/openapi.yaml is a schema a client generator can use (issue #23). It is
// linted by Redocly (spec/redocly.yaml, recommended-strict), and the live admin API is
// held to it: a deployment is built through the API (group, account on the mock, price,
// tenant, key, a top-up, a billed request), then every operation of the spec is called,
// and each answer — 2xx and errors alike — validates (ajv, JSON Schema 2020-12) against
// the schema of its operation and status; every request body sent validates against the
// operation's request schema. A field the API returns that the spec does not document
// (or documents and the API does not return) fails the test.

import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { REPO, startMock, stopAll, tempDir } from './lib/harness.mjs';
import { adminClient, chat, chatReq, createDb, startStateGateway } from './lib/db.mjs';

const SPEC = path.join(REPO, 'spec/openapi.yaml');
const BIN = path.join(REPO, 'spec/node_modules/.bin');

let doc;
let ajv;
let db;
let gw;
let admin;
let mock;
const seen = new Set(); // "METHOD /template STATUS" validated
const problems = [];

async function loadValidator() {
  const { parse } = await import('yaml');
  const { default: Ajv2020 } = await import('ajv/dist/2020.js');
  const { default: addFormats } = await import('ajv-formats');
  doc = parse(fs.readFileSync(SPEC, 'utf8'));
  ajv = new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  ajv.addFormat('int32', { type: 'number', validate: (n) => Number.isInteger(n) && n >= -(2 ** 31) && n < 2 ** 31 });
  ajv.addFormat('int64', { type: 'number', validate: (n) => Number.isInteger(n) });
  ajv.addSchema({ $id: 'openapi.json', components: doc.components }, 'openapi.json');
}

const resolve = (o) => (o && o.$ref ? o.$ref.replace(/^#\//, '').split('/').reduce((x, k) => x[k.replace(/~1/g, '/')], doc) : o);

/** The spec's path template that `p` (/tenants/3) matches, or undefined. */
function templateOf(p) {
  const bare = p.split('?')[0];
  return Object.keys(doc.paths).find((t) => new RegExp(`^${t.replace(/\{[^}]+\}/g, '[^/]+')}$`).test(bare));
}

function check(schemaRef, value, what) {
  const v = ajv.getSchema(`openapi.json${schemaRef}`) || ajv.compile({ $ref: `openapi.json${schemaRef}` });
  if (!v(value)) problems.push(`${what}: ${ajv.errorsText(v.errors, { separator: '; ' })}\n  ${JSON.stringify(value).slice(0, 400)}`);
}

/** Calls the admin API and validates the request body and the answer against the spec. */
async function call(method, p, body, opts) {
  const t = templateOf(p);
  assert.ok(t, `${p} is not in spec/openapi.yaml`);
  const op = doc.paths[t][method.toLowerCase()];
  assert.ok(op, `${method} ${t} is not in spec/openapi.yaml`);
  if (body !== undefined) {
    const rb = op.requestBody?.content?.['application/json']?.schema;
    if (rb?.$ref && !opts?.invalidBody) check(rb.$ref, body, `${method} ${t} request body`);
  }
  const r = await admin.call(method, p, body, opts);
  const resp = resolve(op.responses[String(r.status)] || op.responses.default);
  if (!resp) {
    problems.push(`${method} ${t}: status ${r.status} is not documented (${r.text.slice(0, 200)})`);
    return r;
  }
  const ctype = String(r.headers['content-type'] || '').split(';')[0].trim();
  const schema = resp.content?.['application/json']?.schema;
  if (ctype && ctype !== 'application/json' && resp.content?.[ctype]) {
    // A document of another kind (the capture's JSON lines): the media type is the contract.
  } else if (schema) {
    assert.ok(schema.$ref, `${method} ${t} ${r.status}: schema by reference`);
    check(schema.$ref, r.json ?? r.text, `${method} ${t} -> ${r.status}`);
  } else if (r.text !== '') {
    problems.push(`${method} ${t} -> ${r.status}: a body the spec does not describe: ${r.text.slice(0, 200)}`);
  }
  seen.add(`${method} ${t} ${r.status}`);
  return r;
}

before(async () => {
  await loadValidator();
  mock = await startMock();
  db = await createDb();
  // The capture of live decisions on, so its download has something to answer.
  const capture = { rate: 1, file: path.join(tempDir('capture'), 'capture.jsonl') };
  // The policy workbench's store on, so its operations answer.
  gw = await startStateGateway(db, { plugins: { capture, store: path.join(tempDir('store'), 'policies') } }, { mock, billing: true });
  admin = adminClient(gw);
});

after(async () => {
  await stopAll();
  await db?.drop();
});

test('spec/openapi.yaml passes the Redocly linter (recommended-strict)', () => {
  const r = spawnSync(path.join(BIN, 'redocly'), ['lint', '--config', 'spec/redocly.yaml', 'spec/openapi.yaml'], {
    cwd: REPO,
    encoding: 'utf8',
    timeout: 60000,
    env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true', NO_COLOR: '1' },
  });
  assert.ok(!r.error, `redocly not installed (spec/install-deps.sh: npm ci in spec/): ${r.error}`);
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`.replace(/^.*[║╔╚].*$/gm, ''));
  assert.match(r.stdout + r.stderr, /valid/);
});

test('every answer of the live admin API validates against its operation in the spec', async () => {
  // Build a deployment through the API.
  const g = (await call('POST', '/groups', { name: 'g1', models: [], rate_multiplier: '1', plugins: {} })).json;
  const acct = (await call('POST', '/accounts', {
    name: 'a1', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-up-1', concurrency: 8, priority: 1,
    weight: 100, models: [], model_map: { alias: 'mock-gpt' }, cost_multiplier: 1.5, groups: [g.id],
  })).json;
  await call('POST', '/prices', { model: 'mock-gpt', input: '0.15', output: 0.6, cache_read: '0.075' });
  const t = (await call('POST', '/tenants', { name: 't1', balance: '10.00', rpm: 600, rpm_burst: 50, concurrency: 8 })).json;
  const u = (await call('POST', '/users', { tenant_id: t.id, email: 'ops@example.com', name: 'Ops', role: 'admin' })).json;
  const k = (await call('POST', '/keys', { tenant_id: t.id, user_id: u.id, group_id: g.id, name: 'k1', rpm: 60, rpm_burst: 10, budget: '5' })).json;
  assert.match(k.key, /^tg-/);
  const bud = (await call('POST', '/budgets', { name: 'b1', api_key_id: k.id, amount: '3', period: 'day',
    timezone: 'Europe/Berlin', thresholds: [50, 100], webhook_url: 'http://127.0.0.1:9/hook', webhook_secret: 'whsec-1' })).json;
  await call('POST', `/tenants/${t.id}/topup`, { amount: '2.50', note: 'invoice 7' });
  // The account's provider reports its quota (read back by GET /accounts/{id}/quota).
  await (await fetch(`${mock.url}/_mock/quota`, { method: 'POST', body: JSON.stringify({ credential: 'sk-up-1', style: 'unified', limit: 100 }) })).text();
  const billed = await chat(gw, k.key, chatReq('mock-gpt'));
  assert.equal(billed.status, 200, billed.text);

  // Every read, with and without filters.
  for (const p of ['/tenants', `/tenants/${t.id}`, '/users', `/users?tenant_id=${t.id}`, `/users/${u.id}`, '/groups', `/groups/${g.id}`,
    '/keys', `/keys?tenant_id=${t.id}&limit=1`, `/keys/${k.id}`, '/accounts', `/accounts/${acct.id}`, '/prices', '/prices/mock-gpt', '/budgets', `/budgets/${bud.id}`,
    `/accounts/${acct.id}/quota`, `/ledger?tenant_id=${t.id}`, '/ledger?kind=usage&limit=1', '/plugins', '/plugins/capture']) {
    const r = await call('GET', p);
    assert.equal(r.status, 200, `${p}: ${r.text}`);
  }
  // The usage row lands a moment after the answer.
  for (let i = 0; i < 50; i++) {
    const r = await admin.get('/usage');
    if (r.json?.data?.length) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  const usage = (await call('GET', `/usage?tenant_id=${t.id}&limit=10`)).json;
  assert.equal(usage.data.length, 1);
  for (const gb of ['model', 'key', 'tenant', 'hour', 'day']) await call('GET', `/usage/summary?group_by=${gb}`);
  // The rollups (usage #18): a report, the capacity report by account and group, the CSV export.
  const rep = (await call('GET', '/usage/report?group_by=hour,account,model')).json;
  assert.equal(rep.data[0].requests, 1);
  await call('GET', '/usage/report?group_by=');
  await call('GET', '/usage/capacity');
  await call('GET', '/usage/capacity?by=group');
  const csv = await call('GET', '/usage/export');
  assert.match(csv.text, /^hour,tenant_id,api_key_id,group_id,account_id,model,requests,/);
  let dl;
  for (let i = 0; i < 50; i++) {
    dl = await call('GET', '/plugins/capture/download');
    if (dl.status === 200 && dl.text.includes('\n')) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  assert.equal(dl.status, 200, dl.text);
  assert.match(dl.headers['content-type'], /^application\/x-ndjson/);

  // Every write.
  await call('PATCH', `/tenants/${t.id}`, { budget: '100', tpm: 100000, status: 'active' });
  await call('PATCH', `/users/${u.id}`, { role: 'member' });
  await call('PATCH', `/groups/${g.id}`, { models: ['mock-gpt'] });
  await call('PATCH', `/keys/${k.id}`, { concurrency: 4, expires_at: null, allowed_models: ['mock-gpt'], ip_allow: ['127.0.0.0/8'] });
  await call('PATCH', `/accounts/${acct.id}`, { weight: 50, status: 'active' });
  await call('PATCH', '/prices/mock-gpt', { reasoning: '0.9' });
  await call('PATCH', `/budgets/${bud.id}`, { amount: '4', thresholds: [80] });
  const tested = await call('POST', `/accounts/${acct.id}/test`, { model: 'mock-gpt' });
  assert.equal(tested.json.ok, true, tested.text);
  await call('POST', '/plugins/reload');
  const policy = 'return { name = "ok-policy", priority = 1, version = "1.0.0", price = function(ctx) ctx:set_cost(1) end }';
  assert.equal((await call('POST', '/plugins/validate', { name: 'ok-policy', source: policy })).status, 200);
  assert.equal((await call('POST', '/plugins/validate', { name: 'ok-policy', source: 'return {' })).status, 422);
  // The policy workbench: upload, read, replay the capture, shadow, promote, roll back, the audit list.
  assert.equal((await call('PUT', '/policies/ok-policy', { source: policy, config: {} })).status, 200);
  assert.equal((await call('PUT', '/policies/ok-policy', { source: 'return {' })).status, 422);
  assert.equal((await call('PUT', '/policies/ok-policy', { source: policy, config: {} })).status, 409);
  for (const p of ['/policies', '/policies/ok-policy', '/policy-audit', '/policy-audit?name=ok-policy&limit=5']) {
    assert.equal((await call('GET', p)).status, 200, p);
  }
  assert.equal((await call('GET', '/policies/nope')).status, 404);
  assert.equal((await call('POST', '/policies/ok-policy/replay', {})).status, 200);
  assert.equal((await call('POST', '/policies/ok-policy/shadow', { group_id: g.id, sample: 0.5 })).status, 200);
  assert.equal((await call('POST', '/policies/ok-policy/promote', { group_id: g.id })).status, 200);
  assert.equal((await call('POST', '/policies/ok-policy/promote', {})).status, 200);
  assert.equal((await call('POST', '/policies/ok-policy/rollback')).status, 200);
  assert.equal((await call('POST', '/policies/ok-policy/shadow', { group_id: 99999999 })).status, 404);

  // Errors, each in its documented shape.
  assert.equal((await call('GET', '/tenants', undefined, { token: null })).status, 401);
  assert.equal((await call('GET', '/tenants/999999')).status, 404);
  assert.equal((await call('POST', '/tenants', { name: 't1' })).status, 409);
  assert.equal((await call('POST', '/tenants', { name: 'x', rpm: -1 }, { invalidBody: true })).status, 400);
  assert.equal((await call('GET', '/usage?tenant_id=x')).status, 400);
  assert.equal((await call('GET', '/usage/report?from=yesterday')).status, 400);
  assert.equal((await call('GET', '/usage/capacity?by=key')).status, 400);
  assert.equal((await call('GET', '/usage/export?group_by=week')).status, 400);
  assert.equal((await call('POST', `/tenants/${t.id}/topup`, { amount: '-1' }, { invalidBody: true })).status, 400);
  assert.equal((await call('DELETE', `/tenants/${t.id}`)).status, 409);

  // Deletes, last.
  const k2 = (await call('POST', '/keys', { tenant_id: t.id, name: 'k2' })).json;
  assert.equal((await call('DELETE', `/keys/${k2.id}`)).status, 204);
  assert.equal((await call('DELETE', `/users/${u.id}`)).status, 204);
  const p2 = await call('POST', '/prices', { model: 'm-2' });
  assert.equal(p2.status, 201);
  assert.equal((await call('DELETE', '/prices/m-2')).status, 204);
  const a2 = (await call('POST', '/accounts', { name: 'a2', provider: 'anthropic', base_url: `${mock.url}/v1` })).json;
  assert.equal((await call('DELETE', `/accounts/${a2.id}`)).status, 204);
  assert.equal((await call('DELETE', `/budgets/${bud.id}`)).status, 204);
  const t2 = (await call('POST', '/tenants', { name: 't2' })).json;
  assert.equal((await call('DELETE', `/tenants/${t2.id}`)).status, 204);
  const g2 = (await call('POST', '/groups', { name: 'g2' })).json;
  assert.equal((await call('DELETE', `/groups/${g2.id}`)).status, 204);

  assert.deepEqual(problems, []);
  // Every operation of the spec was called with success.
  const missed = [];
  for (const [tmpl, item] of Object.entries(doc.paths)) {
    for (const m of ['get', 'post', 'put', 'patch', 'delete']) {
      if (item[m] && ![...seen].some((s) => s.startsWith(`${m.toUpperCase()} ${tmpl} 2`))) missed.push(`${m.toUpperCase()} ${tmpl}`);
    }
  }
  assert.deepEqual(missed, []);
});

test("the tables' schemas hold core/src/app/tg_tables.c's columns, their enums and nullability", () => {
  const src = fs.readFileSync(path.join(REPO, 'core/src/app/tg_tables.c'), 'utf8');
  const enums = Object.fromEntries([...src.matchAll(/static const char \*const (\w+)\[\] = \{([^}]*)\};/g)]
    .map((m) => [m[1], [...m[2].matchAll(/"([^"]+)"/g)].map((x) => x[1])]));
  const tables = { tenant_cols: 'Tenant', user_cols: 'User', group_cols: 'Group', key_cols: 'ApiKey', account_cols: 'Account', price_cols: 'ModelPrice' };
  const drift = [];
  for (const [arr, schema] of Object.entries(tables)) {
    const body = new RegExp(`static const tg_column_t ${arr}\\[\\] = \\{([\\s\\S]*?)\\n\\};`).exec(src)?.[1];
    assert.ok(body, arr);
    const props = doc.components.schemas[schema].properties;
    for (const m of body.matchAll(/\{"([^"]+)", TG_COL_(\w+), TG_COL_(\w+), (\d), (\d), (\w+),/g)) {
      const [, name, , , , nullable, en] = m;
      const p = props[name];
      if (!p) {
        drift.push(`${schema}.${name}: a column of tg_tables.c the spec does not have`);
        continue;
      }
      const flat = p.oneOf ? p.oneOf : [p];
      const types = flat.flatMap((x) => [].concat(x.type ?? []));
      if (nullable === '1' && !types.includes('null')) drift.push(`${schema}.${name}: nullable in tg_tables.c, not in the spec`);
      if (en !== 'NULL') {
        const want = enums[en];
        const got = (p.enum || []).filter((x) => x !== null);
        if (JSON.stringify(got) !== JSON.stringify(want)) drift.push(`${schema}.${name}: enum ${JSON.stringify(got)}, tg_tables.c ${JSON.stringify(want)}`);
      }
    }
  }
  assert.deepEqual(drift, []);
});

test('the check fails on an answer that drifts from the spec (a missing rpm_burst, an undocumented field, a wrong type)', async () => {
  const t = (await admin.read('/tenants')).data[0];
  const before = problems.length;
  const { rpm_burst: _, ...noBurst } = t;
  check('#/components/schemas/Tenant', noBurst, 'no rpm_burst');
  check('#/components/schemas/Tenant', { ...t, region: 'eu' }, 'an undocumented field');
  check('#/components/schemas/Tenant', { ...t, rpm: '600' }, 'rpm as a string');
  check('#/components/schemas/Tenant', { ...t, status: 'paused' }, 'a status outside the enum');
  const found = problems.splice(before);
  assert.equal(found.length, 4, found.join('\n'));
  assert.match(found[0], /rpm_burst/);
  assert.match(found[1], /additional/);
});
