// The first attempt's account slot is taken by its admission script (issue #17
// "pipeline", goals 2 and 4: nothing stands before the first byte that need not, and the
// fewest scripts per billed request). The account is chosen first, and on a single Redis
// the admission script ("admit+slot") takes the chosen account's slot too, so the
// upstream call waits for one script and one round trip to Redis.
//
//   1. Seen from the client: with every answer from Redis held back 120 ms by a proxy in
//      front of it, a request's first byte comes after one such delay, not two.
//   2. An admitted request runs one script before its upstream call (MONITOR), and it is
//      the one that takes the slot; a refused admission takes no slot and needs no ZREM.
//   3. An admission that waits in its concurrency queue does not hold the account's
//      slot meanwhile (phase slot asks once admitted).
//   4. A client that leaves while its admission (and slot) is in flight leaves no slot
//      taken: the limiter gives back what the script took.
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

test('one script before the upstream call takes the admission and the slot; a refusal takes no slot', async () => {
  assert.equal((await chat(gw, KEY_RPM, chatBody('the one allowed'))).status, 200);
  await new Promise((r) => setTimeout(r, 200));
  const m = redisMonitor(redis.sock);
  await m.ready;
  const ok = await chat(gw, KEY, chatBody('admitted, its slot taken by the same script'));
  const r1 = await chat(gw, KEY_RPM, chatBody('refused'));
  await new Promise((r) => setTimeout(r, 300));
  m.stop();
  assert.equal(ok.status, 200, ok.text);
  assert.equal(r1.status, 429, r1.text);
  const withId = (id) => m.cmds.filter((a) => a.includes(id));
  const scripts = withId(ok.headers['x-request-id']).filter((a) => a[0].toLowerCase() === 'evalsha');
  assert.equal(scripts.length, 1, `one script for the request: ${JSON.stringify(scripts)}`);
  assert.ok(scripts[0].includes(slotKey()), `the admission script takes the account's slot: ${scripts[0]}`);
  assert.ok(scripts[0].some((a) => a.includes('conc:k:')), `... and is the admission (the key's leases): ${scripts[0]}`);
  assert.ok(withId(ok.headers['x-request-id']).some((a) => a[0].toLowerCase() === 'zrem' && a.includes(slotKey())),
    'the slot is given back at the end with a ZREM');
  const refused = withId(r1.headers['x-request-id']).map((a) => a[0].toLowerCase());
  assert.deepEqual(refused.filter((c) => c === 'evalsha'), ['evalsha'], `the refused admission's one script: ${refused}`);
  assert.ok(!m.cmds.some((a) => a[0].toLowerCase() === 'zrem' && a.includes(r1.headers['x-request-id']) &&
    a.includes(slotKey())), 'a refusal took no slot: nothing to give back');
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

test('a client that leaves while its admission is in flight leaves no account slot taken', async () => {
  // Redis 120 ms away (the proxy of test 1): the client is gone after 40 ms, before the
  // admission's answer, which took the slot and the key's lease.
  assert.ok(delayed, 'test 1 started the gateway behind the delaying proxy');
  for (let i = 0; i < 4; i++) {
    const u = new URL(`${delayed.url}/v1/chat/completions`);
    const data = JSON.stringify(chatBody(`gone ${i}`));
    await new Promise((resolve) => {
      const c = net.createConnection({ host: u.hostname, port: Number(u.port) }, () => {
        c.write(`POST ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nAuthorization: Bearer ${KEY}\r\n` +
          `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(data)}\r\n\r\n${data}`);
        setTimeout(() => { c.destroy(); resolve(); }, 40);
      });
      c.on('error', resolve);
    });
  }
  await new Promise((r) => setTimeout(r, 4 * DELAY + 400));
  assert.equal(Number(await redisCli(redis.url, 'ZCARD', slotKey())), 0, 'every slot the scripts took was given back');
  const k = await keyId(db, 'k');
  const leases = await redisCli(redis.url, 'KEYS', `*conc:k:${k}*`);
  for (const set of String(leases).split(/\s+/).filter(Boolean)) {
    assert.equal(Number(await redisCli(redis.url, 'ZCARD', set)), 0, `the key's leases too (${set})`);
  }
});
