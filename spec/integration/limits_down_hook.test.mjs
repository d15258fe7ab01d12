// The on_limiter_down hook deciding per limit, with Redis really stopped (its own
// redis-server, killed by PID and started again) and billing on.
//
// Two gateways share a database and that Redis; each runs the shipped fail-policy
// plugin with different answers per limit:
//
//   money-closed gateway: money closed, rate / tokens / concurrency open
//     → a billed request is refused with 503 billing_unavailable; the upstream sees none
//   money-open gateway:   money open, rate open, tokens closed, concurrency local_limit
//     → a key with an RPM limit is admitted past it (rate open) and billed (money open);
//       a concurrency-1 key admits one request at a time (the instance's own count);
//       a TPM key is refused with 503 limiter_unavailable (tokens closed)
//
// What the mock upstream saw is counted for each case; /metrics counts each decision
// per limit and policy. A third gateway (money open) carries a steady load from before
// the kill until after Redis is back. When Redis returns (empty) the limits are enforced
// in Redis again, and nothing is lost: every request answered 200 has its usage and
// ledger row, none refused has one, and `tollgate ledger verify` is clean.

import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { REPO, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, metrics, plainKey, startRedis, tally } from './lib/db.mjs';
import { CRED, MODEL, PRICES, count, ledger, liveMoney, startBilledGateway, waitUsageRow } from './lib/billing.mjs';

const K = { plain: plainKey('plain'), rate: plainKey('rate'), conc: plainKey('conc'), tpm: plainKey('tpm'), load: plainKey('load') };
const LOAD_CRED = 'sk-limits-down-load'; // the load's own upstream account, counted apart
const BURST = 2;
let mock;
let redis;
let db;
let bill;
let gwClosed;
let gwOpen;
let gwLoad;
let load;
const ok = []; // request ids answered 200
const refused = []; // request ids refused

const plugin = (config) => ({
  dirs: [path.join(REPO, 'plugins')],
  watch: false,
  enabled: [{ name: 'fail-policy', config }],
});

before(async () => {
  mock = await startMock();
  redis = await startRedis();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme', balance: '100' }],
    groups: [{ name: 'g', models: [] }, { name: 'l', models: [] }],
    accounts: [
      { name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['g'] },
      { name: 'load-up', provider: 'openai', base_url: `${mock.url}/v1`, credential: LOAD_CRED, concurrency: 1000, groups: ['l'] },
    ],
    keys: [
      { name: 'plain', tenant: 'acme', group: 'g', key: K.plain },
      { name: 'rate', tenant: 'acme', group: 'g', key: K.rate, rpm: 6 },
      { name: 'conc', tenant: 'acme', group: 'g', key: K.conc, concurrency: 1 },
      { name: 'tpm', tenant: 'acme', group: 'g', key: K.tpm, tpm: 1000000 },
      { name: 'load', tenant: 'acme', group: 'l', key: K.load, rpm: 1000000, concurrency: 1000 },
    ],
    prices: [PRICES],
  }, { redis: redis.url });
  await db.exec(`UPDATE api_keys SET rpm_burst = ${BURST} WHERE name = 'rate'`);
  const [ids] = await db.query(`SELECT (SELECT id FROM tenants WHERE name = 'acme') AS tenant_id,
    (SELECT id FROM api_keys WHERE name = 'plain') AS key_id`);
  bill = { db, conninfo: db.conninfo, redis: redis.url, key: K.plain, tenantId: ids.tenant_id, keyId: ids.key_id };
  gwClosed = await startBilledGateway(bill, {
    redis_timeout_ms: 250,
    plugins: plugin({ money: 'closed', rate: 'open', tokens: 'open', concurrency: 'open' }),
  }, { mock });
  gwOpen = await startBilledGateway(bill, {
    redis_timeout_ms: 250,
    plugins: plugin({ money: 'open', rate: 'open', tokens: 'closed', concurrency: 'local_limit' }),
  }, { mock });
  gwLoad = await startBilledGateway(bill, {
    redis_timeout_ms: 250,
    plugins: plugin({ money: 'open', rate: 'local_limit', tokens: 'local_limit', concurrency: 'local_limit' }),
  }, { mock });
});

/** Two clients sending requests to gwLoad (limits it never reaches, billed) until stopped. */
function startLoad() {
  const state = { stop: false, statuses: [], errors: [] };
  state.done = Promise.all([0, 1].map(async () => {
    for (let i = 0; i < 5000 && !state.stop; i++) {
      try {
        const r = await send(gwLoad, K.load, body(`load ${i}`));
        state.statuses.push(r.status);
      } catch (e) {
        state.errors.push(e.message);
      }
      await new Promise((res) => setTimeout(res, 5));
    }
  }));
  return state;
}

after(async () => {
  await stopAll();
  await redis?.stop();
  await db?.drop();
});

const body = (text, extra) => chatReq(MODEL, `${text} [mock chunks=1]`, { max_tokens: 50, ...extra });

/** Sends one request; files its id under ok / refused. */
async function send(gw, key, b = body('x'), opts = {}) {
  const r = await chat(gw, key, b, { timeout: 15000, ...opts });
  (r.status === 200 ? ok : refused).push(r.headers['x-request-id']);
  return r;
}

/** Requests the upstream saw on the tests' account (the load has its own). */
const seen = async () => (await mock.stats()).credentials[CRED]?.requests ?? 0;

test('Redis up: every key passes, and the RPM key is held by its Redis bucket', async () => {
  for (const gw of [gwClosed, gwOpen]) {
    for (const k of ['plain', 'conc', 'tpm']) {
      const r = await send(gw, K[k]);
      assert.equal(r.status, 200, `${k}: ${r.text}`);
    }
  }
  const rs = [];
  for (let i = 0; i < BURST + 1; i++) rs.push(await send(gwOpen, K.rate));
  assert.deepEqual(rs.map((r) => r.status), [...Array(BURST).fill(200), 429]);
});

test('Redis killed: money closed refuses billed requests; nothing reaches the upstream', async () => {
  load = startLoad();
  await waitFor(() => load.statuses.length >= 10, { timeout: 5000, what: 'the load to run' });
  await redis.stop('SIGKILL');
  await waitFor(async () => (await chat(gwClosed, K.plain, body('probe'))).status === 503,
    { timeout: 5000, interval: 50, what: 'the money-closed gateway to notice' });
  const m0 = await metrics(gwClosed);
  const before = await seen();
  const rs = await Promise.all(Array.from({ length: 6 }, (_, i) => send(gwClosed, K.rate, body(`closed ${i}`))));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 503: 6 });
  for (const r of rs) {
    assert.equal(r.json?.error?.code, 'billing_unavailable', r.text);
    assert.ok(Number(r.headers['retry-after'] ?? 1) >= 1);
  }
  assert.equal(await seen(), before, 'the upstream saw none of them');
  const m1 = await metrics(gwClosed);
  const d = (s) => m1[s] - m0[s];
  assert.equal(d('tollgate_limiter_down_limits_total{limit="rate",policy="open"}'), 6, 'rate: open, as the plugin said');
  assert.equal(d('tollgate_limiter_down_limits_total{limit="money",policy="closed"}'), 6, 'money: closed');
  assert.equal(d('tollgate_limiter_down_total{policy="open"}'), 6, 'every admission decided without Redis, once');
});

test('Redis down: the money-open gateway obeys the plugin per limit', async (t) => {
  const m0 = await metrics(gwOpen);
  // rate open + money open: the RPM key (its Redis bucket is empty) is admitted 6 times.
  let before = await seen();
  const rate = await Promise.all(Array.from({ length: 6 }, (_, i) => send(gwOpen, K.rate, body(`open ${i}`))));
  assert.deepEqual(tally(rate.map((r) => r.status)), { 200: 6 }, rate.map((r) => r.text).join('\n'));
  assert.equal(await seen() - before, 6, 'the upstream saw all 6');

  // concurrency local_limit: one at a time on the key of concurrency 1.
  before = await seen();
  const conc = await Promise.all(Array.from({ length: 4 }, (_, i) =>
    send(gwOpen, K.conc, chatReq(MODEL, `conc ${i} [mock chunks=8 interval_ms=100]`, { max_tokens: 50, stream: true }))));
  const ct = tally(conc.map((r) => r.status));
  assert.deepEqual(ct, { 200: 1, 429: 3 }, conc.map((r) => r.text.slice(0, 200)).join('\n'));
  for (const r of conc.filter((x) => x.status === 429)) assert.equal(r.json?.error?.code, 'concurrency_limit_exceeded');
  assert.equal(await seen() - before, 1, 'the upstream saw one');
  // Its count went back: the next one passes.
  assert.equal((await send(gwOpen, K.conc)).status, 200);

  // tokens closed: the TPM key is refused.
  before = await seen();
  const tpm = await Promise.all(Array.from({ length: 3 }, (_, i) => send(gwOpen, K.tpm, body(`tpm ${i}`))));
  assert.deepEqual(tally(tpm.map((r) => r.status)), { 503: 3 });
  for (const r of tpm) assert.equal(r.json?.error?.code, 'limiter_unavailable');
  assert.equal(await seen(), before, 'the upstream saw none');

  const m1 = await metrics(gwOpen);
  const d = (s) => m1[s] - m0[s];
  t.diagnostic(JSON.stringify(Object.fromEntries(Object.keys(m1).filter((k) => k.startsWith('tollgate_limiter_down') || k.includes('unheld')).map((k) => [k, d(k)]))));
  assert.equal(d('tollgate_limiter_down_limits_total{limit="rate",policy="open"}'), 6);
  assert.equal(d('tollgate_limiter_down_limits_total{limit="concurrency",policy="local"}'), 5);
  assert.equal(d('tollgate_limiter_down_limits_total{limit="tokens",policy="closed"}'), 3);
  assert.equal(d('tollgate_limiter_down_limits_total{limit="money",policy="open"}'), 6 + 2, 'asked for every admitted request');
  assert.equal(d('tollgate_billing_total{event="unheld"}'), 6 + 2, 'billed without a hold');
  assert.equal(d('tollgate_limiter_down_total{policy="closed"}'), 3);
});

test('Redis back (empty): the limits are enforced in Redis again', async (t) => {
  await redis.restart();
  const t0 = Date.now();
  // Probes that fail while a worker has no Redis: plain on the money-closed gateway, the
  // TPM key (tokens closed) on the other; 8 fresh connections reach both workers.
  await waitFor(async () => {
    const a = await Promise.all(Array.from({ length: 8 }, () => chat(gwClosed, K.plain, body('back'))));
    const b = await Promise.all(Array.from({ length: 8 }, () => chat(gwOpen, K.tpm, body('back'))));
    for (const r of [...a, ...b]) (r.status === 200 ? ok : refused).push(r.headers['x-request-id']);
    return [...a, ...b].every((r) => r.status === 200);
  }, { timeout: 15000, interval: 200, what: 'every worker back on Redis' });
  t.diagnostic(`back on Redis after ${Date.now() - t0} ms`);
  await new Promise((res) => setTimeout(res, 300));
  load.stop = true;
  await load.done;
  t.diagnostic(`load: ${JSON.stringify(tally(load.statuses))}`);
  assert.deepEqual(load.errors.slice(0, 3), [], 'every load request got an answer');
  assert.deepEqual(tally(load.statuses), { 200: load.statuses.length }, 'money open: the load went on through the outage');
  const rs = [];
  for (let i = 0; i < BURST + 2; i++) rs.push(await send(gwOpen, K.rate, body(`again ${i}`)));
  assert.deepEqual(rs.map((r) => r.status), [...Array(BURST).fill(200), 429, 429], 'the Redis bucket of the RPM key again');
  assert.equal(rs[BURST].json?.error?.code, 'rate_limit_exceeded');
  assert.doesNotMatch(rs[BURST].json?.error?.message, /local|unavailable/);
});

test('money open against a Redis that keeps its data: the cost still comes off the live balance', async (t) => {
  // Redis stops answering (SIGSTOP, well under the client's stall limit: the connection
  // stays) and resumes with its data. Requests admitted meanwhile without a hold must
  // still be charged to the live balance when they settle, or the tenant could spend
  // their cost a second time.
  await waitFor(async () => (await liveMoney(bill)).avail !== null, { timeout: 5000, what: 'the live balance loaded' });
  const quiet = async () => {
    let last;
    await waitFor(async () => {
      const v = (await liveMoney(bill)).avail;
      const same = v === last;
      last = v;
      return same;
    }, { timeout: 5000, interval: 300, what: 'a quiet live balance' });
    return last;
  };
  const avail0 = await quiet();
  const ids = [];
  process.kill(redis.pid, 'SIGSTOP');
  try {
    for (let i = 0; i < 3; i++) {
      const r = await send(gwOpen, K.plain, body(`stopped ${i}`));
      assert.equal(r.status, 200, r.text);
      ids.push(r.headers['x-request-id']);
    }
  } finally {
    process.kill(redis.pid, 'SIGCONT');
  }
  let cost = 0n;
  for (const id of ids) cost += (await waitUsageRow(bill, id, 15000)).cost;
  assert.ok(cost > 0n);
  let seenAvail;
  try {
    await waitFor(async () => (seenAvail = (await liveMoney(bill)).avail) === avail0 - cost, { timeout: 10000 });
  } catch {
    const m = await metrics(gwOpen);
    assert.fail(`live balance ${seenAvail}, expected ${avail0} - ${cost}; gateway Redis counters: ${
      JSON.stringify(Object.fromEntries(Object.entries(m).filter(([k]) => k.startsWith('tollgate_redis_total'))))}`);
  }
  t.diagnostic(`live balance ${avail0} → ${avail0 - cost} nano-USD`);
});

test('nothing lost: one usage and one ledger row per admitted request, none for refused ones; the ledger verifies', async (t) => {
  const list = (ids) => ids.map((x) => `'${x}'`).join(',');
  // One query for all of them (one per request id took minutes on a loaded machine).
  await waitFor(async () => (await count(bill, 'usage', `request_id IN (${list(ok)})`)) === ok.length,
    { timeout: 30000, what: `a usage row for each of the ${ok.length} admitted requests` });
  assert.equal(await count(bill, 'usage', `request_id IN (${list(ok)})`), ok.length);
  assert.equal(await count(bill, 'usage', `request_id IN (${list(ok)}) AND ledger_id IN (SELECT id FROM ledger WHERE kind = 'usage')`),
    ok.length, 'each in a ledger entry');
  assert.equal(await count(bill, 'usage', `request_id IN (${list(refused)})`), 0);
  // The requests billed without a hold settled like the others.
  await waitFor(async () => (await count(bill, 'reservations', `request_id IN (${list(ok)}) AND state <> 'reconciled'`)) === 0,
    { timeout: 15000, what: 'every reservation reconciled' });
  // `tollgate ledger verify`: every Postgres invariant holds. The one comparison with
  // Redis may show the drift README "Limits" documents for money open: the cost of
  // requests admitted without a hold that settled while their worker was still
  // reconnecting, after another worker had reloaded the balance from Postgres — the
  // live balance too high by at most what such requests cost, never too low.
  const v = await ledger(bill, 'verify');
  const lines = v.stdout.split('\n').filter((l) => /^(ok|PROBLEM)/.test(l));
  assert.ok(lines.length >= 8, v.stdout + v.stderr);
  for (const l of lines) if (!/Redis reserved totals/.test(l)) assert.match(l, /^ok /, l);
  const drift = /redis_avail=(-?\d+) pg_avail=(-?\d+) redis_reserved=(\d+) pg_reserved=(\d+)/.exec(v.stdout);
  if (drift) {
    const [, ra, pa, rr, pr] = drift;
    const unheld = BigInt(await bill.db.scalar(`SELECT (coalesce(sum(settled_cost), 0) * 1000000000)::bigint
      FROM reservations WHERE note = 'unheld'`));
    t.diagnostic(`Redis live balance above Postgres by ${BigInt(ra) - BigInt(pa)} nano-USD (unheld requests cost ${unheld})`);
    assert.equal(rr, pr, 'the held amounts agree');
    assert.ok(BigInt(ra) > BigInt(pa) && BigInt(ra) - BigInt(pa) <= unheld, v.stdout);
  } else {
    assert.match(v.stdout, /^ok {3}Redis reserved totals match Postgres/m);
  }
  for (const gw of [gwClosed, gwOpen]) assert.ok(gw.proc.running);
});
