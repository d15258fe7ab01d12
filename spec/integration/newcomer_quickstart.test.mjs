// newcomer: examples/quickstart.sh as a new user meets it (issue #23). In a clean
// checkout (no build/, no var/) it starts its own Postgres, Redis, mock upstream and
// gateway on 127.0.0.1, applies the demo state, and prints a key of the demo tenant whose
// sample answer is routed over the demo group's accounts, limited and billed — with the
// cost it prints equal to the usage row and the ledger entry in its Postgres. Applying
// the demo state again changes nothing; SIGTERM stops every process it started. With
// TOLLGATE_UPSTREAM the same demo key reaches that upstream as an account of the demo
// group, any model name passed through. The script itself is shellcheck-clean.

import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { REPO, TG_BIN, fetchT, startMock, stopAll } from './lib/harness.mjs';
import { cleanCheckout, qsPsql, startQuickstart } from './lib/quickstart.mjs';

let dir;
let qs;
const nano = (s) => {
  const m = /^(-?)(\d*)(?:\.(\d*))?$/.exec(String(s).trim());
  assert.ok(m, `not a decimal: ${s}`);
  const v = BigInt(m[2] || '0') * 1_000_000_000n + BigInt((m[3] || '').padEnd(10, '0').slice(0, 10)) / 10n;
  return m[1] ? -v : v;
};

before(async () => {
  dir = cleanCheckout();
  assert.ok(!fs.existsSync(path.join(dir, 'var')) && !fs.existsSync(path.join(dir, 'build')), 'the copy is clean');
  qs = await startQuickstart(dir);
});

after(async () => {
  if (qs && !qs.exit) await qs.stop();
  await stopAll();
  if (dir && !process.env.TG_KEEP_TMP) fs.rmSync(dir, { recursive: true, force: true });
});

test('quickstart.sh is shellcheck-clean', () => {
  const r = spawnSync('shellcheck', ['-x', 'examples/quickstart.sh'], { cwd: REPO, encoding: 'utf8' });
  assert.ok(!r.error, `shellcheck not found (spec/install-deps.sh installs it): ${r.error}`);
  assert.equal(r.status, 0, r.stdout + r.stderr);
});

test('the quickstart prints the contract lines, a streamed answer, its cost and the console URL', () => {
  const { out } = qs;
  assert.equal(out.TOLLGATE_URL, `http://127.0.0.1:${qs.port}/v1`, qs.tail());
  assert.equal(out.TOLLGATE_ADMIN_URL, `http://127.0.0.1:${qs.port}/admin/`);
  assert.match(out.TOLLGATE_KEY, /^tg-demo-[0-9a-f]{32}$/);
  const i = qs.stdout.indexOf('--- sample: POST /v1/chat/completions (stream) ---');
  assert.ok(i >= 0, qs.tail());
  assert.equal(qs.stdout[i + 1].trim(), Array.from({ length: 12 }, (_, k) => `tok${k + 1}`).join(' '));
  assert.match(out.TOLLGATE_SAMPLE_COST, /^0\.\d+$/, qs.tail());
  assert.ok(nano(out.TOLLGATE_SAMPLE_COST) > 0n);
  assert.ok(qs.stdout.some((l) => l.startsWith(`cost: ${out.TOLLGATE_SAMPLE_COST} USD for `)), qs.tail());
  assert.equal(qs.consoleUrl, `http://127.0.0.1:${qs.port}/admin/usage`);
  // The same lines for another terminal (the README's tour starts with `. var/quickstart.env`).
  const envFile = path.join(dir, 'var', 'quickstart.env');
  assert.equal(fs.statSync(envFile).mode & 0o777, 0o600);
  const sourced = execFileSync('bash', ['-c', `. "${envFile}" && echo "$TOLLGATE_URL $TOLLGATE_KEY $TOLLGATE_ADMIN_TOKEN"`], { encoding: 'utf8' });
  assert.equal(sourced.trim(), `${out.TOLLGATE_URL} ${out.TOLLGATE_KEY} ${out.TOLLGATE_ADMIN_TOKEN}`);
});

test('the sample answer has a usage row and a ledger entry of the printed cost, for the demo key in the demo group', () => {
  const rid = qs.out.TOLLGATE_SAMPLE_REQUEST;
  assert.match(rid, /^[0-9a-f]{12}-[0-9a-f]{18}$/); // <ms in hex>-<random> (sql/0009_partitions.sql)
  const rows = qsPsql(qs, `SELECT u.cost, t.name, k.name, g.name, a.name, u.model, u.estimated,
      (SELECT string_agg(amount::text || ' ' || kind, ',') FROM ledger l WHERE l.request_id = u.request_id OR l.id = u.ledger_id)
    FROM usage u JOIN tenants t ON t.id = u.tenant_id JOIN api_keys k ON k.id = u.api_key_id
    JOIN groups g ON g.id = u.group_id JOIN accounts a ON a.id = u.account_id WHERE u.request_id = '${rid}'`);
  assert.equal(rows.length, 1, `one usage row for ${rid}`);
  const [cost, tenant, key, group, account, model, estimated, ledger] = rows[0];
  assert.equal(nano(cost), nano(qs.out.TOLLGATE_SAMPLE_COST));
  assert.deepEqual([tenant, key, group, model, estimated], ['demo', 'demo', 'demo', 'mock-gpt', 'f']);
  assert.match(account, /^mock-(us-east|eu-west|ap-south)$/);
  const [amount, kind] = ledger.split(' ');
  assert.equal(kind, 'usage');
  assert.equal(nano(amount), -nano(qs.out.TOLLGATE_SAMPLE_COST), 'the ledger debits the printed cost');
});

test('the demo state: a funded tenant, three differing accounts in one group, prices, a key with limits and a budget', () => {
  const t = qsPsql(qs, "SELECT balance > 99, status FROM tenants WHERE name = 'demo'");
  assert.deepEqual(t, [['t', 'active']]);
  const accts = qsPsql(qs, `SELECT a.name, a.cost_multiplier, a.weight, a.status FROM accounts a
    JOIN account_groups ag ON ag.account_id = a.id JOIN groups g ON g.id = ag.group_id
    WHERE g.name = 'demo' ORDER BY a.name`);
  assert.deepEqual(accts.map((r) => [r[0], r[3]]), [
    ['mock-ap-south', 'active'], ['mock-eu-west', 'active'], ['mock-us-east', 'active'], ['upstream', 'disabled'],
  ]);
  assert.ok(new Set(accts.slice(0, 3).map((r) => `${Number(r[1])}/${r[2]}`)).size > 1, 'the accounts differ');
  const k = qsPsql(qs, "SELECT rpm, concurrency, budget > 0 FROM api_keys WHERE name = 'demo'");
  assert.deepEqual(k, [['60', '4', 't']]);
  const p = qsPsql(qs, 'SELECT model FROM model_prices ORDER BY model').map((r) => r[0]);
  assert.deepEqual(p, ['mock-claude', 'mock-embed', 'mock-gpt']);
});

test('applying the demo state a second time changes nothing', () => {
  const env = {
    ...process.env,
    TOLLGATE_MOCK_URL: `http://127.0.0.1:${qs.mockPort}/v1`,
    TOLLGATE_DEMO_KEY: qs.out.TOLLGATE_KEY,
  };
  for (const k of ['TOLLGATE_PG', 'TOLLGATE_REDIS', 'TOLLGATE_SECRET_KEY', 'TOLLGATE_ADMIN_TOKEN']) delete env[k];
  const first = fs.readFileSync(path.join(dir, 'var', 'apply.log'), 'utf8');
  assert.match(first, /applied: 10 created, 0 updated, 0 unchanged/);
  const again = execFileSync(TG_BIN, ['apply', '-c', 'var/tollgate.lua', 'examples/state.lua'], { cwd: dir, env, encoding: 'utf8' });
  assert.match(again, /^applied: 0 created, 0 updated, 10 unchanged$/m, again);
  assert.doesNotMatch(again, /^[+~]/m);
});

test("the demo key's rate limit refuses a burst with 429 and Retry-After", async () => {
  const url = `${qs.out.TOLLGATE_URL}/chat/completions`;
  const statuses = [];
  let retryAfter;
  for (let i = 0; i < 24 && !retryAfter; i++) {
    const r = await fetchT(url, {
      method: 'POST',
      headers: { authorization: `Bearer ${qs.out.TOLLGATE_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'mock-gpt', max_tokens: 4, messages: [{ role: 'user', content: 'hi [mock chunks=2]' }] }),
    });
    await r.arrayBuffer();
    statuses.push(r.status);
    if (r.status === 429) retryAfter = r.headers.get('retry-after');
  }
  assert.ok(statuses.includes(200), statuses.join(','));
  assert.ok(retryAfter && Number(retryAfter) >= 1, `a 429 within 21 requests (burst 20): ${statuses.join(',')}`);
});

test('SIGTERM stops the gateway, the mock, Postgres and Redis the quickstart started', async () => {
  assert.ok(Object.values(qs.pids).every(Boolean), JSON.stringify(qs.pids));
  const { exit, leftover } = await qs.stop();
  assert.deepEqual(leftover, []);
  assert.equal(exit.code, 0, qs.tail());
});

test('TOLLGATE_UPSTREAM: the demo key reaches that upstream as account "upstream" of group demo, any model passed through', async () => {
  const real = await startMock(); // stands in for a provider
  const q = await startQuickstart(dir, {
    env: {
      TOLLGATE_UPSTREAM: `${real.url}/v1`,
      TOLLGATE_UPSTREAM_KEY: 'sk-real-provider-1',
      TOLLGATE_MODEL: 'provider-model-x.1',
    },
  });
  try {
    assert.equal(q.out.TOLLGATE_KEY, qs.out.TOLLGATE_KEY, 'the same demo key across runs');
    const last = await real.last();
    assert.equal(JSON.parse(last.body).model, 'provider-model-x.1');
    assert.equal(last.headers.authorization, 'Bearer sk-real-provider-1');
    const rows = qsPsql(q, `SELECT a.name, g.name FROM usage u JOIN accounts a ON a.id = u.account_id
      JOIN groups g ON g.id = u.group_id WHERE u.request_id = '${q.out.TOLLGATE_SAMPLE_REQUEST}'`);
    assert.deepEqual(rows, [['upstream', 'demo']]);
    assert.ok(q.stderr.some((l) => /no price for model provider-model-x\.1/.test(l)), q.tail());
  } finally {
    const { exit, leftover } = await q.stop();
    assert.deepEqual(leftover, []);
    assert.equal(exit.code, 0);
  }
});
