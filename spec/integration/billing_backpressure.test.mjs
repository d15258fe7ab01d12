// Two things a slow Postgres or a scale-in must not break.
//
// Backpressure: settlements wait for Postgres in a per-worker queue, and requests never
// wait for it. When Postgres takes them more slowly than requests come, the queue must
// not grow without bound (memory, and what a kill -9 would lose): beyond
// billing.queue_max elements it spills to the fsync'd local spool, which is replayed as
// soon as Postgres keeps up. Nothing is lost, nothing is billed twice.
//
// The reconciler's lock: one reconciler per deployment holds a Redis lock whose TTL is
// at least reconcile_after_ms. A gateway stopped gracefully gives it back, so another
// instance takes over at its next pass instead of after the TTL.
//
// A private Redis: the reconciler lock is deployment-wide, so a gateway of another test
// on the suite's Redis could hold it.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { chat, redisCli, startRedis, tally } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  count,
  mockInputTokens,
  pool,
  startBilledGateway,
  verifyLedger,
} from './lib/billing.mjs';

let mock;
let redis;
let bill;

before(async () => {
  mock = await startMock();
  redis = await startRedis();
  bill = await billedSetup({ mock, balance: '100', redis: redis.url });
});

after(async () => {
  await stopAll();
  await redis?.stop();
  await bill?.db.drop();
});

/** Elements in the spool folder's files (each line is a JSON array of elements). */
/** Elements in the spool's files, a settlement carrying its reservation counting two
 *  (sql/0023: a pair is written as one element); with `merged`, only those. */
function spooledElements(dir, { merged = false } = {}) {
  let n = 0;
  for (const f of fs.readdirSync(dir)) {
    for (const line of fs.readFileSync(path.join(dir, f), 'utf8').split('\n')) {
      if (!line) continue;
      for (const e of JSON.parse(line)) {
        const pair = !e.op && e.amount !== undefined;
        if (!merged || pair) n += pair ? 2 : 1;
      }
    }
  }
  return n;
}

async function metric(gw, event) {
  const text = await (await fetch(`${gw.url}/metrics`)).text();
  const m = new RegExp(`tollgate_billing_total\\{event="${event}"\\} (\\d+)`).exec(text);
  return m ? Number(m[1]) : NaN;
}

test('Postgres stalled under load: the settlement queue stays within queue_max (the rest spills to the spool), then everything is billed exactly once', async () => {
  const spoolDir = tempDir('spool');
  const QMAX = 50;
  const N = 300;
  // One worker: one queue to bound. postgres_timeout_ms above the stall, so the batches
  // at Postgres wait rather than fail: what leaves memory here is the spill.
  const gw = await startBilledGateway(bill, { workers: 1, postgres_timeout_ms: 30000, billing: { queue_max: QMAX } },
    { mock, spoolDir });
  const before = await accountsMoney(bill);
  const text = 'under backpressure [mock chunks=2]';
  const locker = spawn('psql', ['-X', '-q', '-d', bill.conninfo, '-c',
    "SET application_name = 'tg-locker'; BEGIN; LOCK TABLE usage IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60); COMMIT;"],
  { stdio: 'ignore' });
  const lockerExit = new Promise((resolve) => locker.on('exit', resolve));
  await waitFor(async () => Number(await bill.db.scalar(
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'usage' AND l.mode = 'AccessExclusiveLock' AND l.granted")) > 0,
  { timeout: 5000, what: 'the lock on usage' });

  // Every request is answered while nothing can be settled.
  const t0 = Date.now();
  const rs = await pool(Array.from({ length: N }, (_, i) => i), 16, () => chat(gw, bill.key, chatBody(text)));
  const took = Date.now() - t0;
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: N }, 'settlement never holds a response');

  // Two elements per request (reservation, settlement): at most queue_max in the queue
  // and two batches cut from it at Postgres; everything else is on disk.
  const onDisk = spooledElements(spoolDir);
  assert.ok(onDisk >= 2 * N - 3 * QMAX,
    `with Postgres stalled, ${2 * N} elements: ${onDisk} in the spool, so at most ${2 * N - onDisk} in memory (bound ${3 * QMAX}); answered in ${took} ms`);
  assert.ok(await metric(gw, 'spooled') >= 2 * N - 3 * QMAX);
  // A request's reservation and settlement spilled together are one element on disk
  // (the replay then costs Postgres what a live batch does): nearly all of them here.
  assert.ok(spooledElements(spoolDir, { merged: true }) >= onDisk / 2,
    `pairs written as one element: ${spooledElements(spoolDir, { merged: true })} of ${onDisk}`);
  assert.equal(await metric(gw, 'settled'), 0, 'Postgres is still stalled');

  await bill.db.scalar("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'tg-locker'");
  await lockerExit;

  // The spool is replayed batch by batch as soon as Postgres takes them again.
  const ids = rs.map((r) => r.headers['x-request-id']);
  await waitFor(async () => Number(await bill.db.scalar(`SELECT count(*) FROM usage WHERE request_id = ANY ('{${ids.join(',')}}')`)) === N,
    { timeout: 30000, what: `all ${N} usage rows` });
  await waitFor(async () => spooledElements(spoolDir) === 0, { timeout: 10000, what: 'the spool to be empty' });
  const each = costOf(mockInputTokens(text), 2);
  const rows = await bill.db.query(`SELECT request_id, count(*) AS n, sum(cost) AS cost FROM usage WHERE request_id = ANY ('{${ids.join(',')}}') GROUP BY request_id HAVING count(*) <> 1`);
  assert.deepEqual(rows, [], 'each request billed exactly once');
  assert.equal(await count(bill, 'reservations', "state <> 'reconciled'"), 0, 'every reservation row written and reconciled');
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - BigInt(N) * each);
  assert.equal(await metric(gw, 'conflict'), 0);
  await gw.stop();
  await verifyLedger(bill);
});

test('a reconciler stopped gracefully gives its lock back: another instance takes over at its next pass, not after the TTL', async () => {
  // reconcile_after_ms 60 s: the lock's TTL is 60 s, each instance tries every 5 s.
  const a = await startBilledGateway(bill, { billing: { reconcile_after_ms: 60000 } }, { mock, spoolDir: tempDir('spool') });
  let holder = '';
  await waitFor(async () => (holder = await redisCli(redis.url, 'GET', 'tollgate:reconciler')) !== '',
    { timeout: 10000, what: 'the first gateway to take the reconciler lock' });
  const b = await startBilledGateway(bill, { billing: { reconcile_after_ms: 60000 } }, { mock, spoolDir: tempDir('spool') });
  await sleep(6000); // b tries at least once while a holds the lock
  assert.equal(await redisCli(redis.url, 'GET', 'tollgate:reconciler'), holder, 'a keeps it while it runs');
  assert.ok(Number(await redisCli(redis.url, 'PTTL', 'tollgate:reconciler')) > 45000, 'a TTL long enough to matter');

  a.proc.signal('SIGTERM');
  assert.deepEqual(await a.proc.exited, { code: 0, signal: null });
  const right = await redisCli(redis.url, 'GET', 'tollgate:reconciler');
  assert.notEqual(right, holder, 'released at shutdown, not left to expire in 60 s');
  let next = '';
  await waitFor(async () => (next = await redisCli(redis.url, 'GET', 'tollgate:reconciler')) !== '',
    { timeout: 7000, what: 'the other gateway to take the lock at its next pass' });
  assert.notEqual(next, holder);
  await b.stop();
});
