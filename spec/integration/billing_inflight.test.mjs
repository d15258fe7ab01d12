// Money in flight (pipeline #17, goal 3): what must hold whatever Postgres keeps about the
// requests that are held and not settled yet. These are the guarantees a design with
// fewer Postgres rows per request must keep (README, Billing; spec/bench/RESULTS.md,
// "568e937 withdrawn"): a balance or key budget loaded from Postgres while requests are
// in flight subtracts them, a key deleted mid-request keeps its bill, and a dead
// gateway's holds are settled exactly once.
//
//   (a) Redis loses its data with requests in flight: the balance reloaded from Postgres
//       still counts them (no more admitted than the balance covers), nothing is billed
//       twice, Postgres never goes negative, the live balance never stands above
//       Postgres'; (a2) the books agree after: the reload put the lost holds back
//       (core/redis/restore.lua), so their settlements gave back what they held above cost.
//   (b) a key gains a budget while its requests are held: the budget loaded then counts
//       them (not overspent).
//   (c) a key deleted while its first request is held: the bill lands, the key's row
//       stays (revoked), no hold is left in Redis.
//   (d) a gateway killed (-9) mid-stream: `tollgate ledger reconcile` settles its hold
//       exactly once and gives it back; ledger verify clean. (d2) the same when the hold's
//       row never reached Postgres: `ledger reconcile` finds it in the Redis holds index.
//   (e) a request settled in Postgres whose hold was never given back (its gateway died
//       between the commit and the release): `ledger reconcile` gives it back once, the
//       actual cost kept. (e2) the same on a live gateway whose release Redis lost (a
//       primary killed after acknowledging it): the gateway's own reconciler gives it back.
//   (f) a gateway killed between a failed attempt and its retry: the reconciler charges
//       the attempt's bound in Redis as in Postgres (its hold went back for the retry, its
//       reservation stayed), so the live balance and Postgres' agree.
//
// A private Redis: the test flushes it, and the reconciler lock is deployment-wide.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { fetchT, sleep, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { adminClient, chat, redisCli, startRedis } from './lib/db.mjs';
import {
  CRED,
  accountsMoney,
  billedSetup,
  chatBody,
  count,
  fmtNano,
  ledger,
  liveMoney,
  reservationFor,
  startBilledGateway,
  streamChat,
  usageRows,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';

let mock;
let redis;
let flushed; // test (a)'s deployment, for (a2)

before(async () => {
  mock = await startMock();
  redis = await startRedis();
});

after(async () => {
  await stopAll();
  await redis?.stop();
});

// A bound of about 2 USD per request (max_tokens 1,000,000 at 2 USD per million output
// tokens): a handful of requests in flight are a large part of the balance, while what
// each one really costs (the mock's few tokens) is a few micro-USD.
const MAX = 1000000;
const longBody = (tag, ms = 3000) =>
  chatBody(`${tag} [mock chunks=${Math.round(ms / 100)} interval_ms=100]`, { maxTokens: MAX, stream: true });
const boundOf = (body) => reservationFor(Buffer.byteLength(JSON.stringify({ stream: true, ...body })), MAX);

/** Starts `n` long streams of `tag`; resolves once each has its answer head (or a refusal). */
async function startStreams(gw, key, tag, n) {
  const heads = [];
  const done = [];
  for (let i = 0; i < n; i++) {
    let headed;
    const head = new Promise((resolve) => {
      headed = resolve;
    });
    done.push(streamChat(gw, key, longBody(`${tag} ${i}`), { onHead: (o) => headed(o) }).then((o) => {
      headed(o);
      return o;
    }));
    heads.push(head);
  }
  const hs = await Promise.all(heads);
  return { heads: hs, done: Promise.all(done) };
}

/** The holds left in Redis for the tenant: {field: value}. */
async function holdsIndex(bill) {
  const out = await redisCli(bill.redis, 'HGETALL', `{t:${bill.tenantId}}:holds`);
  const l = out.split('\n').filter(Boolean);
  const h = {};
  for (let i = 0; i + 1 < l.length; i += 2) h[l[i]] = l[i + 1];
  return h;
}

async function settledAll(bill, ids) {
  await waitFor(async () => {
    const n = Number(await bill.db.scalar(`SELECT count(*) FROM usage WHERE request_id = ANY (ARRAY[${ids.map((x) => `'${x}'`).join(',')}]::text[])`));
    return n === ids.length;
  }, { timeout: 20000, interval: 200, what: `${ids.length} usage rows` });
}

test('(a) Redis flushed with requests in flight: the reloaded balance counts them, never overspent, the live balance never above Postgres', async () => {
  const probe = longBody('flush old 0');
  const R = boundOf(probe);
  // Three requests in flight, then room for two and a half more.
  const bill = await billedSetup({ mock, balance: fmtNano(R * 11n / 2n + 1000000n), redis: redis.url });
  try {
    const gw = await startBilledGateway(bill, {}, { mock, spoolDir: tempDir('spool') });
    const old = await startStreams(gw, bill.key, 'flush old', 3);
    assert.deepEqual(old.heads.map((h) => h.status), [200, 200, 200], 'three requests held');
    await sleep(300); // their reservation rows (or whatever records them) reach Postgres
    assert.equal(await redisCli(bill.redis, 'FLUSHALL'), 'OK');

    // Six more while the first three still run: the balance, reloaded from Postgres,
    // covers only two of them.
    const fresh = await startStreams(gw, bill.key, 'flush new', 6);
    const codes = fresh.heads.map((h) => h.status).sort();
    assert.deepEqual(codes, [200, 200, 402, 402, 402, 402],
      `two admitted, four refused: the balance reloaded from Postgres subtracts the three in flight (${codes})`);
    const oldDone = await old.done;
    const newDone = await fresh.done;
    const ids = [...oldDone, ...newDone].filter((o) => o.status === 200).map((o) => o.requestId);
    assert.equal(ids.length, 5);
    await settledAll(bill, ids);

    const m = await accountsMoney(bill);
    assert.ok(m.balance >= 0n, `Postgres balance never below zero (${m.balance})`);
    assert.equal(await count(bill, 'usage'), 5, 'each admitted request billed once');
    assert.equal(await count(bill, 'usage', 'estimated'), 0, 'at its real usage');
    // Every hold given back: nothing is held, and the live balance never stands above
    // Postgres' (it may stand below it, by at most the three bounds Redis lost: the
    // reload subtracted them, and their holds were gone when they settled).
    await waitFor(async () => ((await liveMoney(bill)).reserved ?? 0n) === 0n, { timeout: 10000, what: 'nothing held' });
    const live = await liveMoney(bill);
    assert.ok(live.avail <= m.balance, `the live balance (${live.avail}) is never above Postgres' (${m.balance})`);
    assert.ok(m.balance - live.avail <= 3n * R, `below it by at most the bounds lost (${m.balance - live.avail} > ${3n * R})`);
    assert.deepEqual(await holdsIndex(bill), {}, 'no hold left in Redis');
    flushed = { bill, gw, m, R };
  } catch (e) {
    await bill.db.drop();
    throw e;
  }
});

test('(a2) after the Redis flush, once everything settled, the books agree (live balance = Postgres, ledger verify clean)', async () => {
  assert.ok(flushed, 'test (a) ran');
  const { bill, gw, m } = flushed;
  try {
    const live = await liveMoney(bill);
    assert.equal(live.avail, m.balance, `live balance = Postgres balance (reserved ${live.reserved})`);
    await verifyLedger(bill);
  } finally {
    await gw.stop();
    await bill.db.drop();
  }
});

// The race (a2) leaves open: a request that settles between the reload's read of Postgres
// (its reservation still open, so subtracted and listed) and restore.lua putting the
// holds back. Its settle.lua found no hold and left "s<cost>", so the restore gives back
// what it held above that cost instead of putting back a hold nobody would settle.
// Run on the private Redis with the scripts' own files (what the binary embeds).
test('(a3) a hold settled while the balance was being reloaded: the restore gives back its unused part, no hold left behind', async () => {
  const src = (n) => fs.readFileSync(path.join(process.env.TG_SOURCE_DIR, 'core/redis', `${n}.lua`), 'utf8');
  const T = `{t:990001}`;
  const r = (...a) => redisCli(redis.url, ...a);
  await r('DEL', `${T}:money`, `${T}:holds`, `${T}:res:x:1`, `${T}:res:y:1`, `${T}:res:z:1`, `${T}:kmoney:5`);
  // Postgres said: balance 10,000, three holds open (x 500, y 300, z 200) → 9,000 available.
  // z survived the loss (only the balance was lost); x settles (cost 100) before the restore.
  await r('SET', `${T}:res:z:1`, '200');
  assert.equal(await r('EVAL', src('settle'), '4', `${T}:money`, `${T}:holds`, `${T}:res:x:1`, `${T}:kmoney:5`, '100', 'x:1'), '0',
    'no hold found for x: nothing given back');
  assert.equal(await r('GET', `${T}:res:x:1`), 's100', 'x marked settled at its cost');
  assert.equal(await r('EXISTS', `${T}:money`), '0', 'no balance written by the settlement');
  const restore = ['EVAL', src('restore'), '5', `${T}:money`, `${T}:holds`, `${T}:res:x:1`, `${T}:res:y:1`, `${T}:res:z:1`, '9000',
    'x:1', '500', '5|gw|1|500|m', 'y:1', '300', '5|gw|2|300|m', 'z:1', '200', '5|gw|3|200|m'];
  assert.equal(await r(...restore), '1', 'one hold put back (y)');
  assert.deepEqual((await r('HMGET', `${T}:money`, 'avail', 'reserved')).split('\n'), ['9400', '500'],
    'x gave back 400 (500 − 100); y and z are held');
  assert.equal(await r('GET', `${T}:res:y:1`), '300');
  assert.equal(await r('HGET', `${T}:holds`, 'y:1'), '5|gw|2|300|m', 'y indexed for the reconciler');
  assert.equal(await r('HEXISTS', `${T}:holds`, 'x:1'), '0', 'x is not held again');
  assert.equal(await r(...restore), '-1', 'a second load changes nothing');
  // y and z settle (costs 50 and 200): every hold back, the balance = 10,000 − 100 − 50 − 200.
  assert.equal(await r('EVAL', src('settle'), '6', `${T}:money`, `${T}:holds`, `${T}:res:y:1`, `${T}:kmoney:5`, `${T}:res:z:1`,
    `${T}:kmoney:5`, '50', 'y:1', '200', 'z:1'), '2');
  assert.deepEqual((await r('HMGET', `${T}:money`, 'avail', 'reserved')).split('\n'), ['9650', '0']);
  assert.equal(await r('HLEN', `${T}:holds`), '0');
  // A resend of x's settlement finds its mark and changes nothing.
  assert.equal(await r('EVAL', src('settle'), '4', `${T}:money`, `${T}:holds`, `${T}:res:x:1`, `${T}:kmoney:5`, '100', 'x:1'), '0');
  assert.deepEqual((await r('HMGET', `${T}:money`, 'avail', 'reserved')).split('\n'), ['9650', '0']);
});

test('(b) a key budget set mid-request: the budget loaded then counts the requests in flight', async () => {
  const bill = await billedSetup({ mock, balance: '1000', redis: redis.url });
  try {
    const gw = await startBilledGateway(bill, {}, { mock, spoolDir: tempDir('spool') });
    const R = boundOf(longBody('budget old 0'));
    const old = await startStreams(gw, bill.key, 'budget old', 3);
    assert.deepEqual(old.heads.map((h) => h.status), [200, 200, 200]);
    await sleep(300);
    // Room for the three in flight and two and a half more.
    const admin = adminClient(gw);
    const up = await admin.patch(`/keys/${bill.keyId}`, { budget: fmtNano(R * 11n / 2n) });
    assert.equal(up.status, 200, up.text);
    await sleep(500); // the gateways reload the key

    const fresh = await startStreams(gw, bill.key, 'budget new', 6);
    const codes = fresh.heads.map((h) => h.status).sort();
    assert.deepEqual(codes, [200, 200, 402, 402, 402, 402],
      `two admitted: the key budget loaded from Postgres subtracts the three in flight (${codes}; ${fresh.heads.map((h) => h.text.slice(0, 80)).join(' | ')})`);
    assert.match(fresh.heads.find((h) => h.status === 402).text, /budget_exceeded/);
    const ids = [...await old.done, ...await fresh.done].filter((o) => o.status === 200).map((o) => o.requestId);
    await settledAll(bill, ids);
    const m = await accountsMoney(bill);
    // Every hold back: the key's live budget is its budget minus its spend.
    await waitFor(async () => {
      const v = await redisCli(bill.redis, 'HGET', `{t:${bill.tenantId}}:kmoney:${bill.keyId}`, 'avail');
      return v !== '' && BigInt(v) === R * 11n / 2n - m.keySpend;
    }, { timeout: 10000, interval: 200, what: 'the live key budget = budget - spend' });
    await verifyLedger(bill);
    await gw.stop();
  } finally {
    await bill.db.drop();
  }
});

test('(c) a key deleted while its first request is held: the bill lands, the key is kept (revoked), no hold left', async () => {
  const bill = await billedSetup({ mock, balance: '1000', redis: redis.url });
  try {
    const gw = await startBilledGateway(bill, {}, { mock, spoolDir: tempDir('spool') });
    const s = await startStreams(gw, bill.key, 'deleted key', 1);
    assert.equal(s.heads[0].status, 200);
    const del = await adminClient(gw).del(`/keys/${bill.keyId}`);
    assert.ok(del.status === 204 || del.status === 409, `the delete is answered (${del.status} ${del.text})`);
    if (del.status === 409) assert.match(del.text, /in flight|held|revoke/i, 'a 409 says why');
    const [o] = await s.done;
    const row = await waitUsageRow(bill, o.requestId, 20000).catch((e) => {
      throw new Error(`${e.message} (delete answered ${del.status}; client ${o.status}, ${o.chunks} chunks)\n${gw.proc.tail(20)}`);
    });
    assert.equal(row.api_key_id, bill.keyId, 'billed to the key');
    assert.equal(await count(bill, 'api_keys', `id = ${bill.keyId}`), 1, 'the key row stays (usage points at it)');
    const after = await chat(gw, bill.key, chatBody('after the delete [mock chunks=1]'));
    if (del.status === 204) assert.equal(after.status, 401, 'a deleted (revoked) key stops working');
    await waitFor(async () => ((await liveMoney(bill)).reserved ?? 0n) === 0n, { timeout: 10000, what: 'nothing held' });
    assert.deepEqual(await holdsIndex(bill), {}, 'no hold left in Redis');
    await verifyLedger(bill);
    await gw.stop();
  } finally {
    await bill.db.drop();
  }
});

test('(d) a gateway killed mid-stream: `ledger reconcile` settles its hold exactly once and gives it back', async () => {
  const bill = await billedSetup({ mock, balance: '1000', redis: redis.url });
  try {
    const gw = await startBilledGateway(bill, {}, { mock, spoolDir: tempDir('spool') });
    const before = await accountsMoney(bill);
    const body = chatBody('killed [mock chunks=200 interval_ms=50]', { maxTokens: 1000, stream: true });
    const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 1000);
    const r = await streamChat(gw, bill.key, body, { onChunk: (n) => n === 5 && gw.proc.signal('SIGKILL') });
    await gw.proc.exited;
    const id = r.requestId;
    assert.equal((await usageRows(bill, id)).length, 0, 'not billed yet');
    assert.equal((await liveMoney(bill)).reserved, R, 'held in Redis');
    await sleep(300);

    const rec = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
    assert.equal(rec.code, 0, rec.stdout + rec.stderr);
    const row = await waitUsageRow(bill, id, 5000);
    assert.equal(row.estimated, true);
    assert.equal(row.cost, R, 'charged at its bound (unknown_usage = "charge")');
    const again = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stdout, /0 request\(s\) settled/, 'a second pass finds nothing');
    assert.equal((await usageRows(bill, id)).length, 1, 'billed exactly once');
    const m = await accountsMoney(bill);
    assert.equal(m.balance, before.balance - R);
    const live = await liveMoney(bill);
    assert.equal(live.reserved, 0n, 'the hold was given back');
    assert.equal(live.avail, m.balance);
    assert.deepEqual(await holdsIndex(bill), {}, 'no hold left in Redis');
    // A live gateway's reconciler, later, finds nothing to do either.
    const gw2 = await startBilledGateway(bill, {}, { mock, spoolDir: tempDir('spool') });
    await sleep(2500);
    assert.equal((await usageRows(bill, id)).length, 1, 'still billed exactly once');
    await verifyLedger(bill);
    await gw2.stop();
  } finally {
    await bill.db.drop();
  }
});

test('(d2) a gateway killed before its hold\'s row reached Postgres: `ledger reconcile` finds the hold in Redis and settles it once', async () => {
  const bill = await billedSetup({ mock, balance: '1000', redis: redis.url });
  try {
    const gw = await startBilledGateway(bill, {}, { mock, spoolDir: tempDir('spool') });
    const before = await accountsMoney(bill);
    // Postgres is slow: the reservations table is locked, so the batch carrying this
    // request's reservation row waits in the gateway's hands when it is killed.
    const locker = spawn('psql', ['-X', '-q', '-d', bill.conninfo, '-c',
      "SET application_name = 'tg-d2-locker'; BEGIN; LOCK TABLE reservations IN SHARE MODE; SELECT pg_sleep(60); COMMIT;"],
    { stdio: 'ignore' });
    const lockerExit = new Promise((resolve) => locker.on('exit', resolve));
    await waitFor(async () => Number(await bill.db.scalar(
      "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'reservations' AND l.mode = 'ShareLock' AND l.granted")) > 0,
    { timeout: 5000, what: 'the lock on reservations' });
    const body = chatBody('killed before its row [mock chunks=200 interval_ms=50]', { maxTokens: 1000, stream: true });
    const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 1000);
    const r = await streamChat(gw, bill.key, body, { onChunk: (n) => n === 5 && gw.proc.signal('SIGKILL') });
    await gw.proc.exited;
    const id = r.requestId;
    await bill.db.scalar(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`);
    await bill.db.scalar("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'tg-d2-locker'");
    await lockerExit;
    assert.equal(await count(bill, 'reservations', `request_id = '${id}'`), 0, 'no row of the request reached Postgres');
    assert.equal((await liveMoney(bill)).reserved, R, 'held in Redis, indexed');

    const rec = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
    assert.equal(rec.code, 0, rec.stdout + rec.stderr);
    assert.match(rec.stdout, /orphaned hold recorded/, rec.stdout);
    const row = await waitUsageRow(bill, id, 5000);
    assert.equal(row.estimated, true);
    assert.equal(row.cost, R, 'charged at its bound (unknown_usage = "charge")');
    const again = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
    assert.match(again.stdout, /0 request\(s\) settled/, 'a second pass finds nothing');
    assert.doesNotMatch(again.stdout, /orphaned hold recorded/);
    assert.equal((await usageRows(bill, id)).length, 1, 'billed exactly once');
    const m = await accountsMoney(bill);
    assert.equal(m.balance, before.balance - R);
    const live = await liveMoney(bill);
    assert.equal(live.reserved, 0n, 'the hold was given back');
    assert.equal(live.avail, m.balance);
    assert.deepEqual(await holdsIndex(bill), {}, 'no hold left in Redis');
    await verifyLedger(bill);
  } finally {
    await bill.db.drop();
  }
});

/** A gateway of bill's and one request through it, settled and its hold given back:
 *  {gw, id, R (its bound), row (its usage row)}. */
async function settledRequest(bill, text) {
  const gw = await startBilledGateway(bill, {}, { mock, spoolDir: tempDir('spool') });
  const body = chatBody(`${text} [mock chunks=2]`, { maxTokens: 1000 });
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 1000);
  const r = await chat(gw, bill.key, body);
  assert.equal(r.status, 200, r.text);
  const id = r.headers['x-request-id'];
  const row = await waitUsageRow(bill, id);
  await waitFor(async () => (await liveMoney(bill)).reserved === 0n, { timeout: 5000, what: 'the hold given back' });
  return { gw, id, R, row };
}

test('(e) a settled request whose hold is still in Redis: `ledger reconcile` gives it back once', async () => {
  const bill = await billedSetup({ mock, balance: '1000', redis: redis.url });
  try {
    const { gw, id, R, row } = await settledRequest(bill, 'settled, its hold kept');
    await gw.stop();
    const settled = await liveMoney(bill);
    // The state a gateway killed between its batch's commit and the release leaves: the
    // hold (reservation, index entry) and the balance as the admission left them.
    const T = `{t:${bill.tenantId}}`;
    await redisCli(bill.redis, 'SET', `${T}:res:${id}:1`, String(R));
    await redisCli(bill.redis, 'HSET', `${T}:holds`, `${id}:1`, `${bill.keyId}|dead-gateway|${Date.now() - 60000}|${R}|mock-gpt`);
    await redisCli(bill.redis, 'HINCRBY', `${T}:money`, 'avail', String(-(R - row.cost)));
    await redisCli(bill.redis, 'HINCRBY', `${T}:money`, 'reserved', String(R));

    const rec = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
    assert.equal(rec.code, 0, rec.stdout + rec.stderr);
    assert.deepEqual(await liveMoney(bill), settled, 'the hold given back: the balance less the actual cost only');
    assert.deepEqual(await holdsIndex(bill), {}, 'no hold left in Redis');
    assert.equal(await redisCli(bill.redis, 'EXISTS', `${T}:res:${id}:1`), '0');
    const again = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
    assert.equal(again.code, 0, again.stderr);
    assert.deepEqual(await liveMoney(bill), settled, 'given back once');
    assert.equal((await usageRows(bill, id)).length, 1, 'billed exactly once');
    await verifyLedger(bill);
  } finally {
    await bill.db.drop();
  }
});

test('(e2) a live gateway whose release was lost (a Redis primary killed after acknowledging it): its own reconciler gives the hold back', async () => {
  const bill = await billedSetup({ mock, balance: '1000', redis: redis.url });
  try {
    const { gw, id, R, row } = await settledRequest(bill, 'settled, its release lost');
    // The gateway's instance, as its holds name it: read off a stream it holds.
    const probe = await startStreams(gw, bill.key, 'probe', 1);
    const instance = Object.values(await holdsIndex(bill))[0]?.split('|')[1];
    await probe.done;
    assert.ok(instance, 'the stream\'s hold names its gateway');
    await waitFor(async () => (await liveMoney(bill)).reserved === 0n, { timeout: 5000, what: 'the probe settled' });
    const settled = await liveMoney(bill);
    // What a replica promoted after its primary was killed holds when the primary had
    // acknowledged the release and not yet passed it on: the hold (reservation, index
    // entry naming the live gateway) and the balance as the admission left them. The
    // gateway believes the hold returned and will never send it again.
    const T = `{t:${bill.tenantId}}`;
    await redisCli(bill.redis, 'SET', `${T}:res:${id}:1`, String(R));
    await redisCli(bill.redis, 'HSET', `${T}:holds`, `${id}:1`, `${bill.keyId}|${instance}|${Date.now() - 3000}|${R}|mock-gpt`);
    await redisCli(bill.redis, 'HINCRBY', `${T}:money`, 'avail', String(-(R - row.cost)));
    await redisCli(bill.redis, 'HINCRBY', `${T}:money`, 'reserved', String(R));
    // An index entry of the same live gateway whose request is not settled (still
    // running, as far as Postgres knows) stays: its gateway settles it.
    const other = `${T}:res:not-settled-yet:1`;
    await redisCli(bill.redis, 'SET', other, '5000');
    await redisCli(bill.redis, 'HSET', `${T}:holds`, 'not-settled-yet:1', `${bill.keyId}|${instance}|${Date.now() - 60000}|5000|mock-gpt`);

    await waitFor(async () => (await liveMoney(bill)).reserved === 0n,
      { timeout: 10000, interval: 100, what: 'the reconciler (2 s reconcile delay) to give the lost release back' });
    assert.deepEqual(await liveMoney(bill), settled, 'given back at the actual cost');
    assert.deepEqual(Object.keys(await holdsIndex(bill)), ['not-settled-yet:1'], "the unsettled hold is left to its gateway");
    assert.equal(await redisCli(bill.redis, 'EXISTS', `${T}:res:${id}:1`), '0');
    assert.equal(await bill.db.scalar("SELECT count(*) FROM reservations WHERE request_id = 'not-settled-yet'"), '0',
      'no row written for a live gateway\'s hold');
    await sleep(1500); // more reconciler passes: nothing more moves
    assert.deepEqual(await liveMoney(bill), settled, 'given back once');
    await redisCli(bill.redis, 'DEL', other);
    await redisCli(bill.redis, 'HDEL', `${T}:holds`, 'not-settled-yet:1');
    assert.equal((await usageRows(bill, id)).length, 1, 'billed exactly once');
    await verifyLedger(bill);
    await gw.stop();
  } finally {
    await bill.db.drop();
  }
});

test('(f) a gateway killed between a failed attempt and its retry: Redis and Postgres charge the attempt alike', async () => {
  // A policy that waits 5 s before the retry: the window in which the gateway dies.
  const dir = tempDir('policies');
  fs.writeFileSync(path.join(dir, 'slow-retry.lua'), `return {
  name = "slow-retry", priority = 10, version = "1",
  on_upstream_error = function(ctx) ctx:retry("other", 5000) end,
}
`);
  const bill = await billedSetup({
    mock,
    balance: '1000',
    redis: redis.url,
    accounts: [{ name: 'up', credential: CRED, priority: 10 }, { name: 'up2', credential: 'sk-billing-account-2', priority: 10 }],
  });
  try {
    const gw = await startBilledGateway(bill, {
      routing: { max_attempts: 3 },
      plugins: { dirs: [dir], enabled: [{ name: 'slow-retry' }] },
    }, { mock, spoolDir: tempDir('spool') });
    const before = await accountsMoney(bill);
    await mock.reset();
    const f = await fetchT(`${mock.url}/_mock/faults`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ credential: '*', status: 503, count: 1 }),
    });
    await f.arrayBuffer();
    assert.ok(f.ok, `mock faults: HTTP ${f.status}`);
    const body = chatBody('killed before its retry [mock chunks=1]', { maxTokens: 1000 });
    const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 1000);
    const answer = chat(gw, bill.key, body).catch((e) => e);
    // The first attempt failed (503) and its row is in Postgres; its hold went back for
    // the retry, which waits.
    await waitFor(async () => (await mock.stats()).total >= 1 && (await count(bill, 'reservations')) === 1 &&
      (await liveMoney(bill)).reserved === 0n, { timeout: 5000, interval: 50, what: 'attempt 1 failed, its row written, its hold back' });
    gw.proc.signal('SIGKILL');
    await gw.proc.exited;
    await answer;
    const id = await bill.db.scalar('SELECT request_id FROM reservations');
    assert.equal((await mock.stats()).total, 1, 'the retry was never sent');
    assert.equal((await usageRows(bill, id)).length, 0, 'not settled');

    const rec = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
    assert.equal(rec.code, 0, rec.stdout + rec.stderr);
    const row = await waitUsageRow(bill, id, 5000);
    assert.equal(row.estimated, true);
    assert.equal(row.cost, R, 'the row still reserved is charged at its bound (unknown_usage = "charge")');
    const m = await accountsMoney(bill);
    assert.equal(m.balance, before.balance - R);
    const live = await liveMoney(bill);
    assert.equal(live.reserved, 0n, 'nothing held');
    assert.equal(live.avail, m.balance, 'the live balance = Postgres\' (the bound charged in both)');
    assert.deepEqual(await holdsIndex(bill), {}, 'no hold left in Redis');
    assert.equal(await redisCli(bill.redis, 'EXISTS', `{t:${bill.tenantId}}:res:${id}:1`), '0', 'the kept reservation is gone');
    await verifyLedger(bill);
  } finally {
    await bill.db.drop();
  }
});
