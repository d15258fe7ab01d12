// The first attempt's account slot goes to Redis with its admission (issue #17
// "pipeline", goal 2: nothing stands before the first byte that need not). The account
// is chosen first, and the admission script and the chosen account's slot script leave
// in one write, so the upstream call waits for one round trip to Redis, not two.
//
//   1. Seen from the client: with every answer from Redis held back 120 ms by a proxy in
//      front of it, a request's first byte comes after one such delay, not two.
//   2. A refused admission gives back the slot asked beside it (a ZREM behind the
//      script): no slot is left taken; a key refused within the last second asks for
//      no slot at all.
//   3. An admission that waits in its concurrency queue does not hold the account's
//      slot meanwhile (the slot's answer is given back; phase slot asks once admitted).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import path from 'node:path';

import { startMock, stopAll, tempDir } from './lib/harness.mjs';
import { applyState, chat, createDb, keyId, plainKey, redisCli, redisMonitor, startRedis } from './lib/db.mjs';
import { CRED, PRICES, chatBody, startBilledGateway } from './lib/billing.mjs';

const KEY = plainKey('pslot');
const KEY_RPM = plainKey('pslotrpm');
const KEY_CONC = plainKey('pslotconc');
const DELAY = 120;
let mock;
let redis;
let db;
let gw;
let delayed;
let proxy;
let account;

/** A unix-socket proxy to Redis that holds every answer back `ms` (in order). */
function delayProxy(target, ms) {
  const sock = path.join(tempDir('rdelay'), 'r.sock');
  const conns = new Set();
  const server = net.createServer((c) => {
    const up = net.createConnection(target);
    conns.add(c).add(up);
    c.on('data', (d) => up.write(d));
    up.on('data', (d) => setTimeout(() => c.destroyed || c.write(d), ms));
    const end = () => { c.destroy(); up.destroy(); };
    c.on('close', end).on('error', end);
    up.on('close', end).on('error', end);
  });
  return new Promise((resolve) => server.listen(sock, () => resolve({
    url: `unix://${sock}`,
    close: () => { for (const c of conns) c.destroy(); server.close(); },
  })));
}

/** Milliseconds from sending a non-stream request to its response's first byte. */
function firstByte(url, key, body) {
  return new Promise((resolve, reject) => {
    const u = new URL(`${url}/v1/chat/completions`);
    const data = JSON.stringify(body);
    const t0 = process.hrtime.bigint();
    const c = net.createConnection({ host: u.hostname, port: Number(u.port) }, () => {
      c.write(`POST ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nAuthorization: Bearer ${key}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(data)}\r\nConnection: close\r\n\r\n${data}`);
    });
    let first = null;
    let text = '';
    c.on('data', (d) => {
      if (first === null) first = Number(process.hrtime.bigint() - t0) / 1e6;
      text += d;
    });
    c.on('end', () => resolve({ ms: first, status: Number(text.slice(9, 12)), text }));
    c.on('error', reject);
  });
}

const slotKey = () => `{a:${account}}:conc`;

before(async () => {
  mock = await startMock();
  redis = await startRedis();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme', balance: '1000', concurrency: 50 }],
    groups: [{ name: 'g' }],
    accounts: [{ name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 8, groups: ['g'] }],
    keys: [
      { name: 'k', tenant: 'acme', group: 'g', key: KEY, rpm: 100000, concurrency: 8 },
      { name: 'krpm', tenant: 'acme', group: 'g', key: KEY_RPM, rpm: 1, rpm_burst: 1 },
      { name: 'kconc', tenant: 'acme', group: 'g', key: KEY_CONC, concurrency: 1 },
    ],
    prices: [PRICES],
  }, { redis: redis.url });
  account = Number(await db.scalar("SELECT id FROM accounts WHERE name = 'up'"));
  gw = await startBilledGateway({ conninfo: db.conninfo, redis: redis.url, key: KEY }, { workers: 1 }, { mock });
});

after(async () => {
  await stopAll();
  proxy?.close();
  await redis?.stop();
  await db?.drop();
});

test('with Redis 120 ms away, the first byte waits for one round trip: admission and slot go together', async () => {
  proxy = await delayProxy(redis.sock, DELAY);
  delayed = await startBilledGateway({ conninfo: db.conninfo, redis: proxy.url, key: KEY },
    { workers: 1, redis_timeout_ms: 5000 }, { mock });
  for (let i = 0; i < 3; i++) assert.equal((await firstByte(delayed.url, KEY, chatBody(`warm ${i}`))).status, 200);
  const times = [];
  for (let i = 0; i < 5; i++) {
    const r = await firstByte(delayed.url, KEY, chatBody(`timed ${i}`));
    assert.equal(r.status, 200, r.text);
    times.push(r.ms);
  }
  times.sort((a, b) => a - b);
  const median = times[2];
  assert.ok(median >= DELAY, `the admission's answer is waited for: ${times}`);
  assert.ok(median < 1.6 * DELAY, `one round trip to Redis before the upstream call, not two (${2 * DELAY} ms): ${times}`);
});

test('a refused admission leaves no account slot taken; a key refused lately asks for none', async () => {
  assert.equal((await chat(gw, KEY_RPM, chatBody('the one allowed'))).status, 200);
  await new Promise((r) => setTimeout(r, 200));
  const m = redisMonitor(redis.sock);
  await m.ready;
  const r1 = await chat(gw, KEY_RPM, chatBody('refused, slot asked beside it'));
  const r2 = await chat(gw, KEY_RPM, chatBody('refused again within a second'));
  await new Promise((r) => setTimeout(r, 300));
  m.stop();
  assert.equal(r1.status, 429, r1.text);
  assert.equal(r2.status, 429, r2.text);
  const slotCmds = (id) => m.cmds.filter((a) => a.includes(slotKey()) && a.includes(id)).map((a) => a[0].toLowerCase());
  // The first refusal's slot was asked in the admission's write: it is given back.
  const first = slotCmds(r1.headers['x-request-id']);
  assert.ok(first.includes('evalsha'), `the slot is asked in the admission's write: ${first}`);
  assert.ok(first.includes('zrem'), `the slot asked beside a refused admission is given back: ${first}`);
  assert.deepEqual(slotCmds(r2.headers['x-request-id']), [], 'a key refused in the last second asks for no slot');
  assert.equal(Number(await redisCli(redis.url, 'ZCARD', slotKey())), 0, 'no slot is left taken');
});

test('an admission waiting in its concurrency queue does not hold the account slot', async () => {
  // A holds the key's one concurrency lease for ~1.5 s; B queues behind it.
  const slow = chatBody('slow [mock chunks=10 interval_ms=150]', { stream: true });
  const a = chat(gw, KEY_CONC, slow);
  await new Promise((r) => setTimeout(r, 300));
  const b = chat(gw, KEY_CONC, chatBody('queued behind A'));
  await new Promise((r) => setTimeout(r, 500));
  const held = await redisCli(redis.url, 'ZCARD', slotKey());
  assert.equal(Number(held), 1, 'only A holds a slot of the account while B waits for the key\'s lease');
  const [ra, rb] = await Promise.all([a, b]);
  assert.equal(ra.status, 200, ra.text);
  assert.equal(rb.status, 200, rb.text);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(Number(await redisCli(redis.url, 'ZCARD', slotKey())), 0, 'both slots given back');
  assert.ok(await keyId(db, 'kconc'));
});
