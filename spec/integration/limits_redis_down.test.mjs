// Redis stopped under load. Three gateways share a private redis-server (started here,
// on a unix socket in a temp dir, so killing it disturbs no other test); each has a
// different on_redis_down_rate policy and its own key (rpm 6, bucket 5):
//
//   closed → 503 limiter_unavailable (with Retry-After)
//   open   → admitted without a limit
//   local  → a bucket of the same limit in the instance (shared by its workers):
//            admits the burst, then 429
//
// The policy is per limit: each gateway's on_redis_down_concurrency is set differently
// from its rate policy, and a key with only a concurrency limit shows it. Nothing
// crashes and every request gets an answer while Redis is gone. When Redis comes back
// on the same socket (empty: no persistence), every worker of every gateway reconnects
// and the limits are enforced in Redis again within a few seconds.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, keepAliveAgent, keyId, metrics, plainKey, redisCli, request, startRedis, startStateGateway, tally } from './lib/db.mjs';

const BURST = 5;
const CRED = 'sk-limits-redis-down';
const POLICIES = ['closed', 'open', 'local'];
const keys = Object.fromEntries(POLICIES.map((p) => [p, plainKey(p)]));
const loadKeys = Object.fromEntries(POLICIES.map((p) => [p, plainKey(`load-${p}`)]));
const CONC_KEY = plainKey('conc-only');
// Each gateway's policy for concurrency limits, set apart from its rate policy.
const CONC_POLICY = { closed: 'open', open: 'closed', local: 'closed' };
let db;
let mock;
let redis;
const gws = {};
let tenant;
const ids = {};

before(async () => {
  mock = await startMock();
  redis = await startRedis();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['main'] }],
    keys: [
      ...POLICIES.map((p) => ({ name: p, tenant: 'acme', group: 'main', key: keys[p], rpm: 6 })),
      // The background load: a limit so high it never refuses while Redis is up.
      ...POLICIES.map((p) => ({ name: `load-${p}`, tenant: 'acme', group: 'main', key: loadKeys[p], rpm: 1000000 })),
      { name: 'conc-only', tenant: 'acme', group: 'main', key: CONC_KEY, concurrency: 1000 },
    ],
  });
  await db.exec(`UPDATE api_keys SET rpm_burst = ${BURST} WHERE rpm = 6`);
  tenant = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  for (const p of POLICIES) ids[p] = await keyId(db, p);
  for (const p of POLICIES) {
    gws[p] = await startStateGateway(db, {
      workers: 2,
      limiter: { on_redis_down_rate: p, on_redis_down_concurrency: CONC_POLICY[p] },
      // Money always fails closed without Redis (README "Limits"); this file is about the
      // rate and concurrency policies, so these gateways do not meter.
      billing: { enabled: false },
    }, { mock, redis: redis.url });
  }
});

after(async () => {
  await stopAll();
  await redis?.stop();
  await db?.drop();
});

const bucketKey = (p) => `{t:${tenant}}:b:k:${ids[p]}`; // the key's token buckets (tg_limits.c)

/** Redis connections a gateway's workers have up now: each connection established counts
 *  one `connect`, and one `disconnect` when an established one is lost. */
const redisUp = async (gw) => {
  const m = await metrics(gw);
  return m['tollgate_redis_total{event="connect"}'] - m['tollgate_redis_total{event="disconnect"}'];
};
const upBefore = {}; // per policy: connections up before Redis was killed (every worker's)

/** Waits until policy p's gateway is back on Redis in every worker: each connection its
 *  workers had before the kill is up again (the metrics count every worker's; requests
 *  alone can all land on one worker), and a probe that fails closed while a worker has
 *  no Redis passes — 8 requests on fresh connections. */
const PROBE = { closed: loadKeys.closed, open: CONC_KEY, local: CONC_KEY };
const backOnRedis = (p, what) => waitFor(async () => {
  if ((await redisUp(gws[p])) < upBefore[p]) return false;
  const rs = await burst(p, 8, PROBE[p]);
  return rs.every((r) => r.status === 200);
}, { timeout: 15000, interval: 100, what });

/** n requests with the policy's key, each on a fresh connection; resolves with the responses. */
const burst = (p, n, key = keys[p]) =>
  Promise.all(Array.from({ length: n }, (_, i) => chat(gws[p], key, chatReq(MODEL, `${p} ${i} [mock chunks=1]`), { timeout: 10000 })));

/** Sends requests to every gateway with its load key until stopped; records outcomes. */
function startLoad() {
  const state = { stop: false, statuses: [], errors: [], codes: [] };
  const workers = POLICIES.flatMap((p) => [0, 1].map(async () => {
    for (let i = 0; i < 2000 && !state.stop; i++) {
      try {
        const r = await chat(gws[p], loadKeys[p], chatReq(MODEL, 'load [mock chunks=1]'), { timeout: 10000 });
        state.statuses.push(`${p}:${r.status}`);
        if (r.status !== 200) state.codes.push(`${p}:${r.status}:${r.json?.error?.code}`);
      } catch (e) {
        state.errors.push(`${p}: ${e.message}`);
      }
      await sleep(5);
    }
  }));
  state.done = Promise.all(workers);
  return state;
}

let load;
let killedAt;
const OUTAGE_MS = 3000; // Redis stays down at least this long, under load

test('with Redis up, every policy enforces the limit in Redis', async () => {
  for (const p of POLICIES) {
    const rs = await burst(p, 2);
    assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 2 }, p);
    assert.equal(await redisCli(redis.url, 'EXISTS', bucketKey(p)), '1', `${p}: the bucket lives in Redis`);
  }
  load = startLoad();
  await sleep(300);
  assert.deepEqual(load.errors, []);
  assert.ok(load.statuses.length > 10, 'the load runs');
  assert.ok(load.statuses.every((s) => s.endsWith(':200')), 'no refusals while Redis is up');
});

test('Redis killed under load: closed → 503 limiter_unavailable', async () => {
  for (const p of POLICIES) {
    upBefore[p] = await redisUp(gws[p]);
    assert.ok(upBefore[p] >= 2, `${p}: both workers have Redis up (${upBefore[p]} connections)`);
  }
  await redis.stop('SIGKILL');
  killedAt = Date.now();
  const t0 = Date.now();
  await waitFor(async () => (await chat(gws.closed, keys.closed, chatReq(MODEL))).status === 503,
    { timeout: 3000, interval: 50, what: 'closed policy to refuse' });
  const noticed = Date.now() - t0;
  assert.ok(noticed < 3000, `noticed after ${noticed} ms`);
  const rs = await burst('closed', 6);
  for (const r of rs) {
    assert.equal(r.status, 503, r.text);
    assert.equal(r.json?.error?.code, 'limiter_unavailable');
    assert.equal(r.json?.error?.type, 'server_error');
    assert.ok(Number(r.headers['retry-after']) >= 1, 'Retry-After');
  }
});

test('Redis down: open → admitted past the limit', async () => {
  // The key has 3 tokens left in the (gone) Redis bucket; open admits all 10.
  const rs = await burst('open', 10);
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 10 }, rs.map((r) => r.text).filter((t) => t.includes('error')).slice(0, 2).join(' '));
});

test('Redis down: local → the instance keeps a bucket of the same limit and refuses past it', async () => {
  // README: the local bucket is the instance's (its workers share it): N·(B + r·T) over
  // an outage of T minutes.
  const agent = keepAliveAgent(1);
  const one = [];
  for (let i = 0; i < BURST + 3; i++) one.push(await chat(gws.local, keys.local, chatReq(MODEL, `local ${i} [mock chunks=1]`), { agent }));
  agent.destroy();
  assert.deepEqual(one.map((r) => r.status), [...Array(BURST).fill(200), 429, 429, 429], 'one connection, one worker: exactly the burst');
  for (const r of one.filter((x) => x.status === 429)) {
    assert.equal(r.json?.error?.code, 'rate_limit_exceeded');
    assert.ok(Number(r.headers['retry-after']) >= 1);
  }
  // Fresh connections reach both workers: the same bucket, refilled by at most one token
  // (rpm 6: one every 10 s) since it started.
  const rs = await burst('local', 12);
  const t = tally(rs.map((r) => r.status));
  assert.equal((t[200] || 0) + (t[429] || 0), 12, JSON.stringify(t));
  assert.ok((t[200] || 0) <= 1, `the instance admitted ${BURST + (t[200] || 0)} with burst ${BURST}: ${JSON.stringify(t)}`);
});

test('the limiter is per limit: a concurrency-only key follows on_redis_down_concurrency', async () => {
  // closed gateway: concurrency fails open; open and local gateways: it fails closed.
  const c = await burst('closed', 4, CONC_KEY);
  assert.deepEqual(tally(c.map((r) => r.status)), { 200: 4 }, 'closed gateway, concurrency policy open');
  for (const p of ['open', 'local']) {
    const rs = await burst(p, 4, CONC_KEY);
    assert.deepEqual(tally(rs.map((r) => r.status)), { 503: 4 }, `${p} gateway, concurrency policy closed`);
    assert.ok(rs.every((r) => r.json?.error?.code === 'limiter_unavailable'));
  }
});

test('the Redis clients count the lost connections in /metrics', async () => {
  for (const p of POLICIES) {
    const m = await metrics(gws[p]);
    assert.ok(m['tollgate_redis_total{event="disconnect"}'] >= gws[p].config.workers,
      `${p}: every worker's client lost its connection: ${m['tollgate_redis_total{event="disconnect"}']}`);
    assert.ok(m['tollgate_redis_total{event="failed_fast"}'] > 0, `${p}: commands failed at once while down`);
  }
});

test('nothing crashed and every request under load got an answer', async () => {
  await sleep(Math.max(0, OUTAGE_MS - (Date.now() - killedAt)));
  load.stop = true;
  await load.done;
  assert.deepEqual(load.errors.slice(0, 5), [], `${load.errors.length} requests failed on the wire`);
  const allowed = new Set(['closed:503:limiter_unavailable']);
  const odd = load.codes.filter((c) => !allowed.has(c));
  assert.deepEqual(odd.slice(0, 5), [], 'open and local load keys (huge limit) are admitted; closed ones get 503 limiter_unavailable');
  assert.ok(load.statuses.some((s) => s === 'closed:503'), 'the closed gateway refused load while Redis was down');
  for (const p of POLICIES) {
    assert.ok(gws[p].proc.running, `${p} gateway is running`);
    assert.equal((await request(`${gws[p].url}/healthz`)).status, 200);
  }
  // Every 503 the load got on the closed gateway was a counted decision.
  const closed503 = load.codes.filter((c) => c === 'closed:503:limiter_unavailable').length;
  assert.ok((await metrics(gws.closed))['tollgate_limiter_down_total{policy="closed"}'] >= closed503 + 6);
});

test('the Redis-down decisions are counted in /metrics, one per request decided while down', async () => {
  // The load has stopped and Redis is still down: each request below is decided without
  // Redis exactly once, by its gateway's rate policy.
  for (const p of POLICIES) {
    const series = `tollgate_limiter_down_total{policy="${p}"}`;
    const perLimit = `tollgate_limiter_down_limits_total{limit="rate",policy="${p}"}`;
    const m0 = await metrics(gws[p]);
    const rs = await burst(p, 7, loadKeys[p]);
    const m1 = await metrics(gws[p]);
    assert.equal(m1[series] - m0[series], 7, `${p}: ${series}`);
    assert.equal(m1[perLimit] - m0[perLimit], 7, `${p}: ${perLimit}`);
    for (const other of POLICIES.filter((x) => x !== p)) {
      const o = `tollgate_limiter_down_total{policy="${other}"}`;
      assert.equal(m1[o] - m0[o], 0, `${p}: ${o} unchanged`);
    }
    const want = p === 'closed' ? { 503: 7 } : { 200: 7 };
    assert.deepEqual(tally(rs.map((r) => r.status)), want, p);
  }
});

test('Redis back on the same socket: every gateway enforces the limits in Redis again within seconds', async (t) => {
  await redis.restart();
  const t0 = Date.now();
  const took = {};
  await Promise.all(POLICIES.map(async (p) => {
    await backOnRedis(p, `${p}: every worker back on Redis`);
    took[p] = Date.now() - t0;
  }));
  t.diagnostic(`every worker back on Redis after ${JSON.stringify(took)} ms`);
  for (const p of POLICIES) assert.ok(took[p] <= 8000, `${p}: limits back in Redis after ${took[p]} ms`);

  for (const p of POLICIES) {
    // The key's bucket in the new (empty) Redis starts full: exactly the burst is admitted.
    const rs = await burst(p, 8);
    const t = tally(rs.map((r) => r.status));
    assert.deepEqual(t, { 200: BURST, 429: 8 - BURST }, `${p}: the Redis bucket of ${BURST} again`);
    assert.equal(await redisCli(redis.url, 'EXISTS', bucketKey(p)), '1', `${p}: the bucket lives in Redis`);
    for (const r of rs.filter((x) => x.status === 429)) {
      assert.equal(r.json?.error?.code, 'rate_limit_exceeded');
      assert.doesNotMatch(r.json?.error?.message ?? '', /local|unavailable/, `${p}: refused by the Redis bucket, not a fallback`);
    }
  }
});

test('a Redis that stops answering (SIGSTOP) times out per command: the policies apply, nothing hangs', async (t) => {
  const k = bucketKey('closed');
  await redisCli(redis.url, 'DEL', k);
  process.kill(redis.pid, 'SIGSTOP');
  try {
    // The connection stays open but nothing answers: only a command timeout can decide.
    const t0 = Date.now();
    const closed = await chat(gws.closed, keys.closed, chatReq(MODEL), { timeout: 10000 });
    const tookClosed = Date.now() - t0;
    const t1 = Date.now();
    const open = await chat(gws.open, keys.open, chatReq(MODEL), { timeout: 10000 });
    const tookOpen = Date.now() - t1;
    t.diagnostic(`closed answered in ${tookClosed} ms, open in ${tookOpen} ms`);
    assert.equal(closed.status, 503, closed.text);
    assert.equal(closed.json?.error?.code, 'limiter_unavailable');
    assert.ok(tookClosed < 2000, `closed policy answered after ${tookClosed} ms (redis_timeout_ms 250)`);
    assert.equal(open.status, 200, open.text);
    assert.ok(tookOpen < 2000, `open policy answered after ${tookOpen} ms`);
    for (const p of ['closed', 'open']) {
      const n = (await metrics(gws[p]))['tollgate_redis_total{event="timeout"}'];
      assert.ok(n >= 1, `${p}: the command timeout is counted (${n})`);
    }
  } finally {
    process.kill(redis.pid, 'SIGCONT');
  }
  const t2 = Date.now();
  await backOnRedis('closed', 'closed gateway back on Redis after SIGCONT');
  t.diagnostic(`back on Redis ${Date.now() - t2} ms after SIGCONT`);
  assert.ok(Date.now() - t2 <= 8000);
  for (const p of POLICIES) assert.ok(gws[p].proc.running, `${p} gateway is running`);
});
