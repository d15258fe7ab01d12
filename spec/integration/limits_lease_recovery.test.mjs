// Leases through Redis trouble (issue 6, items 1 and 5), on a private redis-server
// (started here on a unix socket, so stopping it disturbs no other test):
//
//   - Redis restarted empty under a running stream: the stream's next renewal re-acquires
//     its lease, so the key's concurrency limit holds again (a new request waits and is
//     refused) instead of letting a second request in for the stream's lifetime;
//   - an admission that timed out (Redis stopped by SIGSTOP) still ran in Redis once it
//     woke: the gateway's best-effort release undoes its lease and TPM charge right
//     after, not at the lease TTL (30 s);
//   - a release that failed (Redis down) is sent again: once Redis is back with its data
//     (an RDB snapshot), the lease is gone within seconds, not at the lease TTL.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, keyId, metrics, plainKey, redisCli, startRedis, startStateGateway } from './lib/db.mjs';

const CRED = 'sk-limits-lease-recovery';
const K = Object.fromEntries(['one', 'stop', 'lost'].map((n) => [n, plainKey(`rec-${n}`)]));
const RPM = 1000;
const TPM = 100000;
let db;
let mock;
let redis;
let gw; // lease_ttl_ms 1500: renewed every 500 ms
let slow; // the default lease TTL (30 s): what a missing release would cost
let tenant;

before(async () => {
  mock = await startMock();
  redis = await startRedis();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['main'] }],
    keys: [
      { name: 'one', tenant: 'acme', group: 'main', key: K.one, concurrency: 1 },
      { name: 'stop', tenant: 'acme', group: 'main', key: K.stop, concurrency: 5, rpm: RPM, tpm: TPM },
      { name: 'lost', tenant: 'acme', group: 'main', key: K.lost, concurrency: 5 },
    ],
  });
  tenant = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  // Streams of up to 8 s: the harness's upstream idle timeout (5 s) is raised.
  const upstream = { idle_timeout_ms: 30000 };
  gw = await startStateGateway(db, { workers: 1, upstream, limiter: { lease_ttl_ms: 1500, queue_max: 4, queue_timeout_ms: 300 } }, { mock, redis: redis.url });
  slow = await startStateGateway(db, { workers: 1, upstream }, { mock, redis: redis.url });
});

after(async () => {
  await stopAll();
  await redis?.stop();
  await db?.drop();
});

const leaseKey = async (name) => `{t:${tenant}}:conc:k:${await keyId(db, name)}`;
const leases = async (name) => Number(await redisCli(redis.url, 'ZCARD', await leaseKey(name)));
const inflight = async () => (await mock.stats()).credentials[CRED]?.inflight ?? 0;

test('a stream outlives a Redis restart: its next renewal re-acquires its lease and the limit holds', async (t) => {
  await mock.reset();
  const stream = chat(gw, K.one, chatReq(MODEL, 'long [mock chunks=80 interval_ms=100]', { stream: true }), { timeout: 30000 });
  await waitFor(async () => (await inflight()) === 1, { timeout: 5000, what: 'the stream upstream' });
  assert.equal(await leases('one'), 1);

  await redisCli(redis.url, 'SET', 'lease-recovery:sentinel', '1');
  await redis.restart(); // empty: no persistence
  // (The lease may be back already: the renewal runs every 500 ms.)
  assert.equal(await redisCli(redis.url, 'EXISTS', 'lease-recovery:sentinel'), '0', 'the new Redis is empty');
  const t0 = Date.now();
  await waitFor(async () => (await leases('one')) === 1, { timeout: 5000, interval: 50, what: 'the lease re-acquired' });
  t.diagnostic(`lease back ${Date.now() - t0} ms after the restart (renewal every 500 ms)`);
  const m = await metrics(gw);
  assert.ok((m['tollgate_limiter_lease_total{event="reacquired"}'] ?? 0) >= 1, 'counted in /metrics');

  // Concurrency 1 holds again: a second request waits in the queue, then 429.
  const r = await chat(gw, K.one, chatReq(MODEL, 'second [mock chunks=1]'));
  assert.equal(r.status, 429, r.text);
  assert.equal(r.json?.error?.code, 'concurrency_limit_exceeded');
  const done = await stream;
  assert.equal(done.status, 200);
  assert.equal((await mock.stats()).credentials[CRED].max_inflight, 1, 'never two requests of this key upstream');
  await waitFor(async () => (await leases('one')) === 0, { timeout: 2000, what: 'released' });
});

test('an admission that timed out but ran when Redis woke is undone at once, not at the lease TTL', async (t) => {
  await mock.reset();
  const buckets = `{t:${tenant}}:b:k:${await keyId(db, 'stop')}`;
  // The gateway is on Redis (its connection was lost with the restart above): a request
  // whose admission reached Redis leaves the bucket there.
  await waitFor(async () => {
    await redisCli(redis.url, 'DEL', buckets);
    const w = await chat(slow, K.stop, chatReq(MODEL, 'warm [mock chunks=1]'));
    return w.status === 200 && (await redisCli(redis.url, 'EXISTS', buckets)) === '1';
  }, { timeout: 10000, interval: 100, what: 'the gateway admitting through Redis' });
  await redisCli(redis.url, 'DEL', buckets, await leaseKey('stop'));
  process.kill(redis.pid, 'SIGSTOP');
  let r;
  try {
    // The admission goes out and times out (redis_timeout_ms 250); the local fallback
    // admits it. Redis stays stopped well short of the client's stall detector (5 s).
    r = await chat(slow, K.stop, chatReq(MODEL, 'while stopped [mock chunks=1]', { max_tokens: 50 }), { timeout: 10000 });
    await sleep(500);
  } finally {
    process.kill(redis.pid, 'SIGCONT');
  }
  assert.equal(r.status, 200, r.text);
  const t0 = Date.now();
  // The admission ran in Redis after all: it took an RPM token and wrote the bucket.
  await waitFor(async () => (await redisCli(redis.url, 'EXISTS', buckets)) === '1', { timeout: 3000, what: 'the late admission' });
  const [rpm, tpm] = (await redisCli(redis.url, 'GET', buckets)).split(' ').map(Number);
  assert.equal(rpm, (RPM - 1) * 1000, 'the late admission took its RPM token');
  await waitFor(async () => (await leases('stop')) === 0, { timeout: 3000, interval: 50, what: 'the late lease released' });
  t.diagnostic(`lease gone ${Date.now() - t0} ms after SIGCONT (lease TTL 30 s)`);
  // Its TPM estimate was given back whole: the request was served by the fallback.
  const level = Number((await redisCli(redis.url, 'GET', buckets)).split(' ')[1]);
  assert.equal(level, TPM * 1000, `TPM estimate returned (level ${tpm} after the admission)`);
});

test('a release that failed while Redis was down is sent again once it is back', async (t) => {
  await mock.reset();
  const stream = chat(slow, K.lost, chatReq(MODEL, 'ends while Redis is down [mock chunks=15 interval_ms=100]', { stream: true }), { timeout: 20000 });
  await waitFor(async () => (await leases('lost')) === 1, { timeout: 5000, what: 'the lease taken' });
  // Snapshot with the lease, then Redis dies; the stream ends while it is down, so its
  // release fails.
  assert.equal(await redisCli(redis.url, 'SAVE'), 'OK');
  await redis.stop('SIGKILL');
  const done = await stream;
  assert.equal(done.status, 200);
  await sleep(300);
  await redis.restart(); // loads the snapshot: the lease (TTL 30 s) is back
  const t0 = Date.now();
  await waitFor(async () => (await leases('lost')) === 0, { timeout: 10000, interval: 100, what: 'the release retried' });
  t.diagnostic(`lease released ${Date.now() - t0} ms after Redis came back (lease TTL 30 s)`);
  const m = await metrics(slow);
  assert.ok((m['tollgate_redis_total{event="resend"}'] ?? 0) >= 1, 'counted in /metrics');
});
