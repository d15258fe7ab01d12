// scale (#21, items 2 and 3): the Postgres primary dies under load and its standby is
// promoted. The pair is spec/lib/pg_pair.sh's (the ctest fixture scale.pg_pair: primary
// + hot standby from pg_basebackup -R, synchronous streaming replication); the gateway's
// conninfo lists both hosts with target_session_attrs=read-write, as a production one
// would. Six clients (the official OpenAI SDK) send requests back to back; the primary
// is stopped with `pg_ctl stop -m immediate` (a crash: no checkpoint, connections cut)
// and the standby promoted 2.5 s later.
//
// What must hold: no request fails (keys keep working from the key cache — past their
// cache time, key_cache_ms being 1 s here —, money is held in Redis, reservation rows
// and settlements go to the spool); an admin write meanwhile fails at once with the
// admin API's 503 database_unavailable, and works again after the promotion; every
// answered request has exactly one usage row once the spool is replayed into the new
// primary, as many as the mock served; balances add up and `tollgate ledger verify` is
// clean.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { adminClient, metrics, tally } from './lib/db.mjs';
import {
  CRED,
  accountsMoney,
  billedSetup,
  costOf,
  count,
  ledger,
  liveMoney,
  mockInputTokens,
  startBilledGateway,
} from './lib/billing.mjs';

const PAIR = process.env.TG_TEST_TMP && path.join(process.env.TG_TEST_TMP, 'pgpair');
if (!PAIR || !fs.existsSync(path.join(PAIR, 'conninfo'))) {
  console.log('skipped: no Postgres pair (the fixture scale.pg_pair makes it under spec/run.sh)');
  process.exit(77);
}
const CONNINFO = fs.readFileSync(path.join(PAIR, 'conninfo'), 'utf8').trim();
const BINDIR = fs.readFileSync(path.join(PAIR, 'bindir'), 'utf8').trim();
const AS_PG = fs.readFileSync(path.join(PAIR, 'as_pg'), 'utf8').trim().split(/\s+/).filter(Boolean);

const TEXT = 'failover [mock delay_ms=150 chunks=3]';
const A = costOf(mockInputTokens(TEXT), 3);
let mock;
let bill;
let gw;

/** pg_ctl ARGS as the data's owner. */
function pgCtl(...args) {
  const [cmd, ...rest] = [...AS_PG, path.join(BINDIR, 'pg_ctl'), ...args];
  return new Promise((resolve, reject) => {
    execFile(cmd, rest, { timeout: 60000, cwd: '/' }, (err, stdout, stderr) => {
      if (err) reject(new Error(`pg_ctl ${args.join(' ')}: ${stderr || err.message}`));
      else resolve(stdout);
    });
  });
}

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100', pg: CONNINFO });
  gw = await startBilledGateway(bill, {
    postgres_timeout_ms: 3000,
    key_cache_ms: 1000,
    billing: { reconcile_after_ms: 600000 },
  }, { mock, spoolDir: tempDir('spool') });
});

after(async () => {
  await stopAll();
});

/** Clients sending TEXT through the OpenAI SDK back to back until stop(). */
async function load(clients) {
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ apiKey: bill.key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 20000 });
  const results = [];
  let running = true;
  const loops = Array.from({ length: clients }, async () => {
    while (running) {
      const t = Date.now();
      try {
        const { data, response } = await client.chat.completions.create({
          model: 'mock-gpt', max_tokens: 50, messages: [{ role: 'user', content: TEXT }],
        }).withResponse();
        results.push({ t, status: response.status, id: response.headers.get('x-request-id'), usage: data.usage });
      } catch (e) {
        results.push({ t, status: e.status ?? 0, code: e.code ?? e.error?.code, error: e.message });
        await sleep(50);
      }
    }
  });
  return {
    results,
    async stop() {
      running = false;
      await Promise.all(loops);
      return results;
    },
  };
}

const served = async () => (await mock.stats()).credentials?.[CRED]?.requests ?? 0;

test('the primary crashes under load and the standby is promoted: no request fails, every answer is billed once, the ledger verifies', async () => {
  const admin = adminClient(gw);
  const servedBefore = await served();
  const usageBefore = await count(bill, 'usage');
  const l = await load(6);
  await sleep(1500);

  await pgCtl('-D', path.join(PAIR, 'a/pgdata'), 'stop', '-m', 'immediate', '-w');
  const down = Date.now();
  // An admin write while no host takes writes: the admin API's 503, at once.
  await sleep(300);
  const t0 = Date.now();
  const w = await admin.post('/tenants', { name: 'during-failover' }, { timeout: 10000 });
  const took = Date.now() - t0;
  assert.equal(w.status, 503, w.text);
  assert.equal(w.json?.error?.code, 'database_unavailable', w.text);
  assert.equal(w.json?.error?.type, 'server_error', w.text);
  assert.match(w.json?.error?.message, /failing over/);
  assert.ok(took < 1500, `the admin write failed after ${took} ms (postgres_timeout_ms 3000): not at once`);

  await sleep(2200);
  await pgCtl('-D', path.join(PAIR, 'b/pgdata'), 'promote', '-w');
  const promoted = Date.now();
  // The gateway finds the new primary by itself (the conninfo's next host): admin writes work again.
  await waitFor(async () => (await admin.post('/tenants', { name: `after-failover-${Date.now()}` })).status === 201,
    { timeout: 15000, interval: 250, what: 'an admin write to succeed on the promoted standby' });
  await waitFor(() => l.results.filter((r) => r.t > promoted + 500).length >= 12,
    { timeout: 15000, what: 'requests after the promotion' });
  const results = await l.stop();

  const failed = results.filter((r) => r.status !== 200);
  assert.deepEqual(tally(failed.map((r) => `${r.status} ${r.code ?? ''} ${r.error ?? ''} at promotion${r.t >= promoted ? '+' : ''}${r.t - promoted} ms`)), {},
    `no request failed (${results.length} sent)\n${gw.proc.tail(30)}`);
  const during = results.filter((r) => r.t >= down && r.t < promoted);
  assert.ok(during.length >= 12, `requests were served while no primary was there (${during.length})`);
  for (const r of results) assert.deepEqual([r.usage.prompt_tokens, r.usage.completion_tokens], [mockInputTokens(TEXT), 3]);

  // The key cache served keys past their cache time while Postgres could not answer.
  const m = await metrics(gw);
  assert.ok(m['tollgate_auth_cache_total{result="stale"}'] > 0, `stale key hits: ${m['tollgate_auth_cache_total{result="stale"}']}`);
  assert.ok(gw.proc.lines.stderr.some((x) => /settlement\(s\) spooled/.test(x)), `settlements were spooled\n${gw.proc.tail(20)}`);

  // Every answer billed exactly once, in the new primary, after the spool's replay.
  const ids = results.map((r) => r.id);
  const list = ids.map((x) => `'${x}'`).join(',');
  await waitFor(async () => Number(await bill.db.scalar(`SELECT count(DISTINCT request_id) FROM usage WHERE request_id IN (${list})`)) === ids.length,
    { timeout: 20000, what: `usage rows of all ${ids.length} answered requests` });
  const bad = await bill.db.query(`SELECT request_id, count(*) AS n FROM usage WHERE request_id IN (${list})
    GROUP BY request_id HAVING count(*) <> 1 OR bool_or(estimated) OR min(cost) * 1000000000 <> ${A}`);
  assert.deepEqual(bad, [], 'one usage row per request, at its exact cost');
  const atMock = (await served()) - servedBefore;
  const rows = (await count(bill, 'usage')) - usageBefore;
  assert.equal(rows, ids.length, 'no usage row besides the answered requests');
  assert.equal(rows, atMock, `usage rows (${rows}) = requests the mock served (${atMock})`);
  assert.equal(await count(bill, 'reservations', "state <> 'reconciled'"), 0, 'no reservation left open');
  const money = await accountsMoney(bill);
  assert.equal(money.balance, 100_000_000_000n - BigInt(rows) * A);
  const live = await liveMoney(bill);
  assert.equal(live.reserved, 0n);
  assert.equal(live.avail, money.balance);
  const v = await ledger(bill, 'verify');
  assert.equal(v.code, 0, `ledger verify:\n${v.stdout}${v.stderr}`);
});
