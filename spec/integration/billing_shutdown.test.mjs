// A graceful shutdown does not strand bills on the instance's disk. SIGTERM arrives
// while 100 requests are in flight; the gateway lets them finish (every client gets its
// 200) and exits 0. Postgres is up the whole time — only slow for 2.5 s (the usage table
// locked by another session), well inside limits.shutdown_timeout_ms (5 s) — so every
// one of those requests must be settled in Postgres when the process is gone: gateways
// are stateless and may be scaled in for good, in which case a local spool is never
// replayed and the reconciler later charges the reserved bound instead of the usage.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { chat, tally } from './lib/db.mjs';
import { billedSetup, chatBody, costOf, count, mockInputTokens, startBilledGateway, usageRows } from './lib/billing.mjs';

let mock;
let bill;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '100' });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

test('SIGTERM with 100 requests in flight: every 200 is settled in Postgres before the process exits, nothing left in the spool', async () => {
  const spoolDir = tempDir('spool');
  const gw = await startBilledGateway(bill, { billing: { reconcile_after_ms: 600000 } }, { mock, spoolDir });
  const text = 'shutting down [mock delay_ms=1000 chunks=3]';
  await mock.reset();
  const inflight = Array.from({ length: 100 }, () => chat(gw, bill.key, chatBody(text), { timeout: 20000 }));
  await waitFor(async () => (await mock.stats()).inflight === 100, { timeout: 5000, interval: 20, what: '100 requests at the upstream' });
  const locker = spawn('psql', ['-X', '-q', '-d', bill.conninfo, '-c', 'BEGIN; LOCK TABLE usage IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(2.5); COMMIT;'],
    { stdio: 'ignore' });
  const lockerExit = new Promise((resolve) => locker.on('exit', resolve));
  await sleep(100);
  gw.proc.signal('SIGTERM');
  const rs = await Promise.all(inflight);
  const exit = await gw.proc.exited;
  await lockerExit;
  assert.deepEqual(exit, { code: 0, signal: null }, 'a clean exit');
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 100 }, 'in-flight requests finish during the drain');

  // The process is gone: what is not in Postgres now is only on this instance's disk.
  await sleep(500);
  const spooled = fs.readdirSync(spoolDir)
    .map((f) => fs.readFileSync(path.join(spoolDir, f), 'utf8').split('\n').filter(Boolean).reduce((n, l) => n + JSON.parse(l).length, 0))
    .reduce((a, b) => a + b, 0);
  const missing = [];
  for (const r of rs) {
    const rows = await usageRows(bill, r.headers['x-request-id']);
    if (rows.length !== 1) missing.push(r.headers['x-request-id']);
    else assert.equal(rows[0].cost, costOf(mockInputTokens(text), 3));
  }
  assert.equal(missing.length, 0,
    `every answered request settled in Postgres: ${missing.length} of 100 missing, ${spooled} settlement(s) left in the local spool\n${gw.proc.tail(10)}`);
  assert.equal(await count(bill, 'reservations', "state <> 'reconciled'"), 0);
});
