// A gateway killed with SIGKILL in the middle of a long stream cannot settle it: the
// reservation stays `reserved` in Postgres and held in Redis. After a restart the
// reconciler (one per deployment, a Redis lock) settles it once it is older than
// billing.reconcile_after_ms by the README's rule: unknown usage is charged at the
// reserved bound and marked estimated ("charge"), or released at 0 ("release"). Then
// `tollgate ledger verify` exits 0 and the request is billed exactly once.
//
// The deployment uses a private Redis: the reconciler lock is deployment-wide, so a
// gateway of another test on the suite's Redis could hold it.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { chat, redisCli, startRedis } from './lib/db.mjs';
import {
  CRED,
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  count,
  ledger,
  ledgerRows,
  liveMoney,
  liveReservation,
  mockInputTokens,
  reservationFor,
  reservationRows,
  startBilledGateway,
  streamChat,
  usageRows,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';

let mock;
let redis;
let bill;
let spoolDir;
let restarted;

before(async () => {
  mock = await startMock();
  redis = await startRedis();
  bill = await billedSetup({ mock, balance: '10', redis: redis.url });
  spoolDir = tempDir('spool');
});

after(async () => {
  await stopAll();
  await redis?.stop();
  await bill?.db.drop();
});

/**
 * Starts a gateway, streams a long answer and SIGKILLs the gateway after 10 chunks.
 * Resolves with {id, R, before} once the client saw the stream end.
 */
async function crashMidStream(unknownUsage) {
  const gw = await startBilledGateway(bill, { billing: { unknown_usage: unknownUsage } }, { mock, spoolDir });
  const warm = await chat(gw, bill.key, chatBody('warm [mock chunks=1]'));
  assert.equal(warm.status, 200, warm.text);
  await waitUsageRow(bill, warm.headers['x-request-id']);
  const before = await accountsMoney(bill);
  assert.equal((await liveMoney(bill)).avail, before.balance);

  const body = chatBody('a long answer [mock chunks=200 interval_ms=50]', { maxTokens: 1000, stream: true });
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 1000);
  const abortedBefore = (await mock.stats()).credentials?.[CRED]?.aborted ?? 0;
  const r = await streamChat(gw, bill.key, body, { onChunk: (n) => n === 10 && gw.proc.signal('SIGKILL') });
  await gw.proc.exited;
  assert.equal(gw.proc.exit.signal, 'SIGKILL');
  assert.ok(r.chunks >= 10 && r.chunks < 200, `the client got a truncated stream (${r.chunks} chunks)`);
  assert.doesNotMatch(r.text, /\[DONE\]/, 'never a false success');
  await waitFor(async () => ((await mock.stats()).credentials?.[CRED]?.aborted ?? 0) > abortedBefore, {
    timeout: 3000, what: 'the upstream call to be cut',
  });

  // The crash left the hold in both stores and nothing billed.
  const id = r.requestId;
  assert.deepEqual((await reservationRows(bill, id)).map((x) => [x.state, x.amount]), [['reserved', R]]);
  assert.equal(await liveReservation(bill, id), R, 'still held in Redis');
  assert.equal((await liveMoney(bill)).reserved, R);
  assert.equal((await usageRows(bill, id)).length, 0, 'not billed yet');
  return { id, R, before };
}

test('kill -9 mid-stream, restart: the reconciler charges the reserved bound once (estimated); ledger verify passes', async () => {
  const { id, R, before } = await crashMidStream('charge');

  const t0 = Date.now();
  restarted = await startBilledGateway(bill, { billing: { unknown_usage: 'charge' } }, { mock, spoolDir });
  // reconcile_after_ms is 2000: the restarted gateway's reconciler settles it soon after.
  const row = await waitUsageRow(bill, id, 20000);
  const took = Date.now() - t0;
  assert.equal(row.estimated, true, 'unknown usage is marked estimated');
  assert.equal(row.cost, R, 'charged at the reserved upper bound (unknown_usage = "charge")');
  assert.deepEqual((await reservationRows(bill, id)).map((x) => [x.state, x.settled_cost]), [['reconciled', R]]);

  await waitFor(async () => (await liveMoney(bill)).reserved === 0n, { timeout: 5000, what: 'the Redis hold to be settled' });
  assert.equal(await liveReservation(bill, id), null);
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - R, 'debited once');
  assert.equal(m.keySpend, before.keySpend + R);
  assert.equal((await liveMoney(bill)).avail, m.balance);
  assert.deepEqual(await ledgerRows(bill, id), [{ kind: 'usage', amount: -R }], 'one ledger debit');

  const v = await ledger(bill, 'verify');
  assert.equal(v.code, 0, `ledger verify:\n${v.stdout}${v.stderr}`);
  // A reconciliation pass by hand finds nothing left to do.
  const rec = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
  assert.equal(rec.code, 0, rec.stderr);
  assert.match(rec.stdout, /0 request\(s\) settled/);
  assert.equal((await usageRows(bill, id)).length, 1, 'billed exactly once');
  assert.ok(took < 20000, `reconciled ${took} ms after the restart`);
});

test('the same crash with unknown_usage = "release": settled at 0 (estimated), the whole hold returned', async () => {
  // Stop the gateway of the previous test first so that it is not the one reconciling.
  await restarted?.stop();
  const { id, before } = await crashMidStream('release');
  restarted = await startBilledGateway(bill, { billing: { unknown_usage: 'release' } }, { mock, spoolDir });
  const row = await waitUsageRow(bill, id, 20000);
  assert.equal(row.estimated, true);
  assert.equal(row.cost, 0n, 'released at no cost');
  await waitFor(async () => (await liveMoney(bill)).reserved === 0n, { timeout: 5000, what: 'the Redis hold to be settled' });
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance);
  assert.equal((await liveMoney(bill)).avail, before.balance, 'everything held came back');
  await verifyLedger(bill);
});

test('a request still running after reconcile_after_ms is billed its exact usage, not reconciled at the bound under it', async () => {
  // The reconciler takes every `reserved` row older than reconcile_after_ms for the
  // reservation of a dead gateway. A stream that simply runs longer than that (here
  // 5 s against 2 s) is alive: charging its bound under it and then refusing its real
  // settlement as a "conflict" overcharges the tenant.
  await restarted?.stop();
  const gw = await startBilledGateway(bill, { billing: { unknown_usage: 'charge' } }, { mock, spoolDir });
  const text = 'slow but alive [mock chunks=50 interval_ms=100]';
  const body = chatBody(text, { maxTokens: 1000, stream: true });
  const before = await accountsMoney(bill);
  const r = await streamChat(gw, bill.key, body);
  assert.equal(r.status, 200);
  assert.equal(r.chunks, 50, 'the whole stream arrived');
  const row = await waitUsageRow(bill, r.requestId);
  const exact = costOf(mockInputTokens(text), 50);
  const conflicts = gw.proc.lines.stderr.filter((l) => /CONFLICT/.test(l));
  assert.deepEqual({ estimated: row.estimated, cost: row.cost, conflicts },
    { estimated: false, cost: exact, conflicts: [] },
    `billed its exact usage (${exact}), not the reserved bound (${reservationFor(Buffer.byteLength(JSON.stringify(body)), 1000)})`);
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - exact);
  await gw.stop();
  await verifyLedger(bill);
});

// Reservation rows go to Postgres in the settlement batches, after the Redis hold. A
// gateway killed while Postgres is too slow to take that batch leaves holds in Redis
// with no row. Every hold is also indexed in {t:T}:holds with what its row needs; the
// reconciler finds the holds of dead instances that have no row, writes the row as
// `pending_reconciliation` (dated when the hold was taken) and settles it by the rule.
test('kill -9 while Postgres is slow to record the reservations: the orphaned holds are found, billed once by the rule; ledger verify passes', async () => {
  // Postgres is slow (the reservations table locked by another session) when the
  // gateway dies, with ten streams in flight whose money is held in Redis: the holds
  // must still be found and settled after the restart, or the live balance stays short
  // for ever.
  await restarted?.stop();
  const gw = await startBilledGateway(bill, { billing: { unknown_usage: 'charge' } }, { mock, spoolDir });
  const warm = await chat(gw, bill.key, chatBody('warm [mock chunks=1]'));
  assert.equal(warm.status, 200, warm.text);
  await waitUsageRow(bill, warm.headers['x-request-id']);
  const before = await accountsMoney(bill);
  const openBefore = Number(await count(bill, 'reservations', "state <> 'reconciled'"));

  const locker = spawn('psql', ['-X', '-q', '-d', bill.conninfo, '-c',
    "SET application_name = 'tg-locker'; BEGIN; LOCK TABLE reservations IN SHARE MODE; SELECT pg_sleep(60); COMMIT;"],
  { stdio: 'ignore' });
  const lockerExit = new Promise((resolve) => locker.on('exit', resolve));
  await waitFor(async () => Number(await bill.db.scalar(
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'reservations' AND l.mode = 'ShareLock' AND l.granted")) > 0,
  { timeout: 5000, what: 'the lock on reservations' });
  const body = chatBody('held while Postgres is slow [mock chunks=200 interval_ms=50]', { maxTokens: 1000, stream: true });
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 1000);
  const ids = [];
  const streams = Array.from({ length: 10 }, () => streamChat(gw, bill.key, body, { timeout: 30000, onHead: (o) => ids.push(o.requestId) })
    .catch((e) => ({ error: e.message })));
  await waitFor(async () => (await liveMoney(bill)).reserved === 10n * R, { timeout: 5000, what: 'ten holds in Redis' });
  await sleep(500);
  gw.proc.signal('SIGKILL');
  await gw.proc.exited;
  // The dead gateway's batch waits on the lock in a backend of its own; end it (as
  // Postgres would once it noticed the client gone) so that its rows never commit, then
  // the lock. Only then does the money stand in Redis with no row behind it.
  await bill.db.scalar(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'`);
  await bill.db.scalar("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'tg-locker'");
  await lockerExit;
  await Promise.all(streams);
  assert.equal(ids.length, 10, 'ten streams started');
  assert.equal(Number(await count(bill, 'reservations', "state <> 'reconciled'")), openBefore, 'no row reached Postgres');
  assert.equal(Number(await count(bill, 'reservations', `request_id IN (${ids.map((i) => `'${i}'`).join(',')})`)), 0);
  assert.equal((await liveMoney(bill)).reserved, 10n * R, 'the ten holds are still in Redis');
  assert.equal(Number(await redisCli(bill.redis, 'HLEN', `{t:${bill.tenantId}}:holds`)), 10, 'and indexed');

  restarted = await startBilledGateway(bill, { billing: { unknown_usage: 'charge' } }, { mock, spoolDir });
  // A dead gateway counts as alive until its last heartbeat expires (15 s), and a hold
  // is reconciled once older than reconcile_after_ms (2 s): allow 30 s. (ledger verify
  // alone is not the end: with the rows written as pending_reconciliation and still
  // held in Redis, the books are consistent before they are settled.)
  const settled = async () => Number(await bill.db.scalar(
    `SELECT count(*) FROM usage WHERE request_id IN (${ids.map((i) => `'${i}'`).join(',')})`));
  await waitFor(async () => (await settled()) === 10, { timeout: 30000, what: 'the ten orphaned holds to be settled' })
    .catch(async (e) => {
      throw new Error(`${e.message} (${await settled()} settled); reservation rows: ` +
        `${JSON.stringify(await bill.db.query('SELECT state, note, count(*) FROM reservations GROUP BY state, note'))}\n` +
        restarted.proc.tail(20));
    });
  await waitFor(async () => (await liveMoney(bill)).reserved === 0n, { timeout: 5000, what: 'the Redis holds to be returned' });
  const v = await ledger(bill, 'verify');
  const live = await liveMoney(bill);
  const m = await accountsMoney(bill);
  assert.equal(v.code, 0, `ledger verify after the reconciliation:\n${v.stdout}${v.stderr}\n` +
    `Redis avail=${live.avail} reserved=${live.reserved}; Postgres balance=${m.balance} (before: ${before.balance})`);
  for (const id of ids) {
    const rows = await usageRows(bill, id);
    assert.equal(rows.length, 1, `request ${id} billed exactly once`);
    assert.equal(rows[0].estimated, true, 'unknown usage is marked estimated');
    assert.equal(rows[0].cost, R, 'charged at the reserved bound (unknown_usage = "charge")');
    const res = await bill.db.query(`SELECT state, note FROM reservations WHERE request_id = '${id}'`);
    assert.deepEqual(res.map((x) => [x.state, x.note]),
      [['reconciled', 'orphaned hold: its gateway died before Postgres had the row']]);
  }
  assert.equal(live.reserved, 0n, 'nothing held any more');
  assert.equal(m.balance, before.balance - 10n * R, 'each hold debited once at its bound');
  assert.equal(live.avail, m.balance);
  assert.equal(Number(await redisCli(bill.redis, 'HLEN', `{t:${bill.tenantId}}:holds`)), 0, 'the hold index is empty');
});
