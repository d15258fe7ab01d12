// A crashed gateway's concurrency leases expire by their TTL; nothing needs a manual
// cleanup. Instance X holds all 8 slots of a key with long streams (their leases are
// renewed well past lease_ttl_ms = 2000 while X lives); a request on instance Y waits
// in Y's queue. X is killed with SIGKILL: it releases nothing, yet within about the
// lease TTL Y's request is admitted, and the key has its full 8 slots again.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, keyId, plainKey, redisCli, SUITE_REDIS, startStateGateway, tally } from './lib/db.mjs';

const KEY = plainKey('lease');
const CRED = 'sk-limits-lease';
const LIMIT = 8;
const TTL = 2000;
let db;
let mock;
let x;
let y;
let leaseKey;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['main'] }],
    keys: [{ name: 'k', tenant: 'acme', group: 'main', key: KEY, concurrency: LIMIT }],
  });
  const tenant = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  leaseKey = `{t:${tenant}}:conc:k:${await keyId(db, 'k')}`;
  const cfg = { limiter: { lease_ttl_ms: TTL, queue_max: 64, queue_timeout_ms: 15000 } };
  [x, y] = await Promise.all([startStateGateway(db, cfg, { mock }), startStateGateway(db, cfg, { mock })]);
});

after(async () => {
  await stopAll();
  await db?.drop();
});

const leases = async () => Number(await redisCli(SUITE_REDIS, 'ZCARD', leaseKey));
const liveLeases = async () => Number(await redisCli(SUITE_REDIS, 'ZCOUNT', leaseKey, String(Date.now()), '+inf'));

test('leases of a SIGKILLed instance expire by TTL and another instance admits new requests', async () => {
  // 8 streams of ~15 s on X hold every slot.
  const held = Array.from({ length: LIMIT }, (_, i) =>
    chat(x, KEY, chatReq(MODEL, `hold ${i} [mock chunks=150 interval_ms=100]`, { stream: true }), { timeout: 30000 })
      .then((r) => ({ status: r.status }), (e) => ({ error: e.message })));
  await waitFor(async () => (await mock.stats()).credentials[CRED]?.inflight === LIMIT, { timeout: 5000, what: `${LIMIT} streams upstream` });
  assert.equal(await leases(), LIMIT);

  // A request on Y waits for a slot.
  let done = null;
  const t0 = Date.now();
  const waiting = chat(y, KEY, chatReq(MODEL, 'after the crash [mock chunks=1]'), { timeout: 20000 })
    .then((r) => {
      done = Date.now();
      return r;
    });

  // Longer than the TTL: X renews its leases, so Y keeps waiting and nothing expires.
  await sleep(TTL + 1000);
  assert.equal(done, null, `Y's request must wait while X holds the slots (answered after ${done && done - t0} ms)`);
  assert.equal(await leases(), LIMIT, 'the leases of a live instance are renewed past their TTL');
  assert.equal((await mock.stats()).credentials[CRED].inflight, LIMIT);

  const killedAt = Date.now();
  x.proc.signal('SIGKILL');
  await x.proc.exited;
  const r = await waiting;
  const ms = done - killedAt;
  assert.equal(r.status, 200, `Y's request was admitted: ${r.text}`);
  // The last renewal was at most TTL/3 before the kill, so expiry is 2/3 TTL .. TTL later.
  assert.ok(ms >= TTL / 2, `admitted ${ms} ms after the kill: too early for an expired lease`);
  assert.ok(ms <= TTL + 1500, `admitted ${ms} ms after the kill (lease TTL ${TTL} ms)`);

  const outcomes = await Promise.all(held);
  assert.ok(outcomes.every((o) => o.error || o.status === 200), JSON.stringify(outcomes));

  // Every slot is free again: 8 new streams on Y at once, no waiting. The lease set has
  // no TTL: X's leases that Y's admission did not sweep (it sweeps the expired ones only
  // when the set looks full, and those renewed last may not have expired yet then) stay
  // as expired members until the next admission that finds the set full sweeps them;
  // none of them is live.
  await waitFor(async () => (await liveLeases()) === 0, { timeout: 3000, what: 'no live lease left' });
  await mock.reset();
  const t1 = Date.now();
  const again = await Promise.all(Array.from({ length: LIMIT }, (_, i) =>
    chat(y, KEY, chatReq(MODEL, `fresh ${i} [mock chunks=5 interval_ms=100]`, { stream: true }), { timeout: 20000 })));
  assert.deepEqual(tally(again.map((a) => a.status)), { 200: LIMIT });
  assert.ok(Date.now() - t1 < 2000, `all ${LIMIT} admitted at once (${Date.now() - t1} ms)`);
  assert.equal((await mock.stats()).credentials[CRED].max_inflight, LIMIT);
  await waitFor(async () => (await leases()) === 0, { timeout: 3000, what: 'leases released by Y' });
});

test('a client that goes away while holding a slot releases it at once', async () => {
  await mock.reset();
  const controllers = [];
  const streams = Array.from({ length: LIMIT }, (_, i) => {
    const ac = new AbortController();
    controllers.push(ac);
    return fetch(`${y.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify(chatReq(MODEL, `abandon ${i} [mock chunks=100 interval_ms=100]`, { stream: true })),
      signal: ac.signal,
    }).then(async (res) => {
      const reader = res.body.getReader();
      await reader.read();
      return reader;
    });
  });
  await Promise.all(streams);
  await waitFor(async () => (await leases()) === LIMIT, { timeout: 3000, what: 'slots taken' });
  for (const ac of controllers) ac.abort();
  await waitFor(async () => (await leases()) === 0, { timeout: 1000, what: 'leases released on disconnect (well before the TTL)' });
  await waitFor(async () => (await mock.stats()).credentials[CRED].inflight === 0, { timeout: 2000, what: 'upstream stopped' });
});
