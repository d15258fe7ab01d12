// Postgres rows written per billed request (pipeline #17, goal 3), counted the way the
// benchmark counts them: pg_stat_user_tables (rows inserted and updated) over N requests,
// read after the gateway stopped (a backend reports its counts when it exits).
//
// Since sql/0017 a request settled in the batch of its reservation writes its usage row
// only (which is its dedup); one still in flight when its reservation's batch commits
// also has its reservation row (inserted, then updated to reconciled); the ledger has one
// entry per tenant per batch, and the tenant's balance and the key's spend are one update
// each per batch. Before 0006: four inserts per request (billing_dedup, reservations,
// usage, ledger); 0006: two. The todo below is the whole run's one row per request.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, test } from 'node:test';

import { startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { chat } from './lib/db.mjs';
import { billedSetup, chatBody, pool, startBilledGateway, verifyLedger } from './lib/billing.mjs';

const N = 400;
let mock;
let bill;
let rows; // {table: {ins, upd}} over the N requests

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '1000' });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

async function tableCounts() {
  // usage and ledger are partitioned (sql/0009): their partitions' counts are theirs.
  const out = await bill.db.query(`SELECT coalesce(p.relname, s.relname) AS relname, sum(s.n_tup_ins) AS ins,
    sum(s.n_tup_upd) AS upd FROM pg_stat_user_tables s LEFT JOIN pg_inherits i ON i.inhrelid = s.relid
    LEFT JOIN pg_class p ON p.oid = i.inhparent GROUP BY 1`);
  return Object.fromEntries(out.map((r) => [r.relname, { ins: Number(r.ins), upd: Number(r.upd) }]));
}

test(`${N} billed requests: one usage row each (the dedup), one ledger entry per batch, at most one reservation row each`, async () => {
  const spoolDir = tempDir('spool');
  // A gateway that loads the balance and stops: its backends report their counts as they exit.
  let gw = await startBilledGateway(bill, {}, { mock, spoolDir });
  const warm = await chat(gw, bill.key, chatBody('warm [mock chunks=1]'));
  assert.equal(warm.status, 200);
  await waitFor(async () => Number(await bill.db.scalar('SELECT count(*) FROM usage')) === 1, { what: 'the warm-up billed' });
  await gw.stop();
  const before = await tableCounts();

  gw = await startBilledGateway(bill, {}, { mock, spoolDir });
  // Settlements group into batches while Postgres is busy; here a lock on tenants (which
  // every batch updates last) holds the first batches so the rest queue behind them.
  const locker = spawn('psql', ['-X', '-q', '-d', bill.conninfo, '-c',
    "SET application_name = 'tg-rows-locker'; BEGIN; LOCK TABLE tenants IN SHARE MODE; SELECT pg_sleep(3); COMMIT;"],
  { stdio: 'ignore' });
  const lockerExit = new Promise((resolve) => locker.on('exit', resolve));
  const statuses = await pool(Array.from({ length: N }, (_, i) => i), 40,
    async (i) => (await chat(gw, bill.key, chatBody(`rows ${i} [mock chunks=2]`, { maxTokens: 16 }))).status);
  assert.deepEqual([...new Set(statuses)], [200]);
  await lockerExit;
  await waitFor(async () => Number(await bill.db.scalar('SELECT count(*) FROM usage')) === N + 1,
    { timeout: 30000, interval: 200, what: `${N} usage rows` });
  await gw.stop();
  const afterCounts = await tableCounts();
  rows = {};
  for (const [t, c] of Object.entries(afterCounts)) {
    const b = before[t] || { ins: 0, upd: 0 };
    if (c.ins - b.ins || c.upd - b.upd) rows[t] = { ins: c.ins - b.ins, upd: c.upd - b.upd };
  }
  const per = (t) => rows[t] ? (rows[t].ins + rows[t].upd) / N : 0;
  const total = Object.keys(rows).reduce((s, t) => s + per(t), 0);
  const shown = `rows per request ${total.toFixed(3)}: ${JSON.stringify(rows)}`;
  console.log(`# ${shown}`);

  assert.equal(rows.usage?.ins, N, `one usage row per request (${shown})`);
  assert.equal(rows.billing_dedup, undefined, `no dedup row: the usage row is the dedup (${shown})`);
  // One row per attempt (a request the gateway retried has one per attempt), and the
  // warm-up's own row when its backend's counts reached the statistics only after the
  // snapshot above (CI saw 401 once).
  const attempts = Number(await bill.db.scalar(
    `SELECT coalesce(sum(attempts), 0) FROM usage WHERE request_id <> '${warm.headers['x-request-id']}'`));
  assert.ok((rows.reservations?.ins ?? 0) <= attempts + 1,
    `at most one reservation row per attempt (${attempts} attempts; ${shown})`);
  // A request settled in the batch of its reservation writes no reservation row
  // (sql/0017): only those in flight when their reservation's batch went out have one
  // (here the first requests, whose reservations went before the lock held the batches).
  assert.ok((rows.reservations?.ins ?? 0) < N / 2, `reservation rows only for requests in flight at their batch (${shown})`);
  assert.ok((rows.ledger?.ins ?? N) < N / 10, `one ledger entry per tenant per batch, not per request (${shown})`);
  assert.ok(total <= 1.8, `well under two rows written per billed request (${shown})`);
  await verifyLedger(bill);
});

test('one row written per billed request (goal 3: no reservation row for a request settled on the normal path)', {
  todo: 'a request still in flight when its reservation\'s batch goes out keeps its row (here the first ~80 of 400, their batches held by the lock: 1.5 rows a request); only those settled in the batch of their reservation write one row (spec/bench/RESULTS.md, Pipeline)',
}, () => {
  assert.ok(rows, 'the first test ran');
  const total = Object.values(rows).reduce((s, c) => s + c.ins + c.upd, 0) / N;
  assert.ok(total <= 1.02, `${total.toFixed(3)} rows per request: ${JSON.stringify(rows)}`);
});
