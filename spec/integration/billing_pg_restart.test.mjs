// Postgres restarted under load loses no settlement. A private Postgres (this test
// stops and starts it) and a private Redis; requests run continuously from several
// clients while Postgres is down for a few seconds. The money is held in Redis before
// each upstream call, so traffic goes on (tg_billing.h: a Postgres outage does not stop
// traffic for a tenant whose balance is live in Redis); reservation rows and
// settlements go to the gateway's fsync'd spool and are replayed (every 2 s) once
// Postgres is back: every 200 the clients got has exactly one usage row with its exact
// usage, and `ledger verify` passes. The same holds when Postgres goes away again while
// the spool is being replayed, and when Postgres hangs (SIGSTOP: connections open,
// nothing answered) with batches on the wire: each ends spooled within
// postgres_timeout_ms, and /metrics shows the queue and the batches in flight empty.
//
// reconcile_after_ms is long here, so what settles these requests is the spool, not
// the reconciler's rule for lost requests.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { chat, metrics, startRedis, tally } from './lib/db.mjs';
import {
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  count,
  ledger,
  liveMoney,
  mockInputTokens,
  startBilledGateway,
  startPrivatePg,
} from './lib/billing.mjs';

const TEXT = 'under load [mock delay_ms=400 chunks=3]';
const BODY = chatBody(TEXT, { maxTokens: 50 });
const A = costOf(mockInputTokens(TEXT), 3);
let mock;
let pg;
let redis;
let bill;
let gw;
let spoolDir;

before(async () => {
  mock = await startMock();
  pg = await startPrivatePg();
  redis = await startRedis();
  bill = await billedSetup({ mock, balance: '100', pg: pg.conninfo, redis: redis.url });
  // A query waits at most 1 s for Postgres: past that a reservation is refused (503)
  // and a settlement goes to the spool.
  spoolDir = tempDir('spool');
  gw = await startGateway();
});

after(async () => {
  await stopAll();
  await redis?.stop();
  await pg?.remove();
});

function startGateway() {
  return startBilledGateway(bill, { postgres_timeout_ms: 1000, billing: { reconcile_after_ms: 600000 } },
    { mock, spoolDir });
}

/** Clients sending BODY back to back until stop(); every answer is recorded. */
function load(clients) {
  const results = [];
  let running = true;
  const loops = Array.from({ length: clients }, async () => {
    while (running) {
      const t = Date.now();
      try {
        const r = await chat(gw, bill.key, BODY, { timeout: 20000 });
        results.push({ t, status: r.status, id: r.headers['x-request-id'], code: r.json?.error?.code });
      } catch (e) {
        results.push({ t, status: 0, error: e.message });
        await sleep(50);
      }
    }
  });
  return {
    results,
    async stop() {
      running = false;
      await Promise.all(loops);
      return results;
    },
  };
}

/** Waits until every id has a usage row; then checks each is exact and unique. */
async function checkBilledOnce(ids, timeout = 20000) {
  const list = ids.map((x) => `'${x}'`).join(',');
  await waitFor(async () => Number(await bill.db.scalar(`SELECT count(DISTINCT request_id) FROM usage WHERE request_id IN (${list})`)) === ids.length,
    { timeout, what: `usage rows of all ${ids.length} answered requests` }).catch(async (e) => {
    const have = (await bill.db.scalar(`SELECT count(*) FROM usage WHERE request_id IN (${list})`));
    throw new Error(`${e.message}: ${have} of ${ids.length} have one — settlements were lost\n${gw.proc.tail(30)}`);
  });
  // One query for all of them (a query per request took minutes on a loaded machine).
  const bad = await bill.db.query(`SELECT request_id, count(*) AS n, bool_or(estimated) AS estimated,
      ((min(cost) * 1000000000)::bigint)::text AS cost FROM usage WHERE request_id IN (${list}) GROUP BY request_id
    HAVING count(*) <> 1 OR bool_or(estimated) OR min(cost) * 1000000000 <> ${A}`);
  assert.deepEqual(bad, [], 'each request: exactly one usage row, from the upstream\'s usage (not estimated), at its exact cost');
}

/** How many settlements the gateway has logged as spooled so far. */
function spooled() {
  return gw.proc.lines.stderr.reduce((n, l) => n + Number(/(\d+) settlement\(s\) spooled/.exec(l)?.[1] ?? 0), 0);
}

/** The batchers hold nothing: no element queued, no batch at Postgres (every batch ended
 *  committed or spooled). */
async function batcherIdle(timeout = 10000) {
  let m;
  await waitFor(async () => {
    m = await metrics(gw);
    return m.tollgate_billing_queue === 0 && m['tollgate_billing_batches_inflight{source="live"}'] === 0;
  }, { timeout, what: 'the settlement queue and the batches in flight to be empty' }).catch((e) => {
    throw new Error(`${e.message}: queue ${m?.tollgate_billing_queue}, live batches ${m?.['tollgate_billing_batches_inflight{source="live"}']}\n${gw.proc.tail(20)}`);
  });
}

async function verify() {
  const v = await ledger(bill, 'verify');
  assert.equal(v.code, 0, `ledger verify:\n${v.stdout}${v.stderr}`);
}

test('Postgres stopped for 4 s under load: traffic goes on, every 200 is billed exactly once after the spool replay', async () => {
  const l = load(8);
  await sleep(1500);
  const down = Date.now();
  await pg.stop();
  await sleep(4000);
  await pg.start();
  const up = Date.now();
  // The gateway reconnects (with backoff): wait for 20 answers after it is back.
  await waitFor(() => l.results.filter((r) => r.status === 200 && r.t > up).length >= 20,
    { timeout: 20000, what: 'requests to succeed again after Postgres is back' }).catch((e) => {
    throw new Error(`${e.message}: ${JSON.stringify(tally(l.results.filter((r) => r.t > up).map((r) => r.status)))}\n${gw.proc.tail(20)}`);
  });
  const results = await l.stop();

  const ok = results.filter((r) => r.status === 200);
  const refused = results.filter((r) => r.status !== 200);
  for (const r of refused) {
    assert.equal(r.status, 503, `only 503s besides 200s: ${JSON.stringify(r)}`);
    assert.equal(r.code, 'billing_unavailable', JSON.stringify(r));
  }
  assert.ok(ok.some((r) => r.t < down), 'requests succeeded before the outage');
  assert.ok(spooled() > 0,
    `some settlements had to be spooled (requests in flight when Postgres stopped)\n${gw.proc.tail(20)}`);

  // The money: every answer billed once, exactly; nothing left open anywhere.
  await checkBilledOnce(ok.map((r) => r.id));
  assert.equal(await count(bill, 'usage'), ok.length, 'no usage row for a refused request');
  assert.equal(await count(bill, 'reservations', "state <> 'reconciled'"), 0,
    'no reservation left open (none for a refused request either)');
  const m = await accountsMoney(bill);
  assert.equal(m.balance, 100_000_000_000n - BigInt(ok.length) * A);
  const live = await liveMoney(bill);
  assert.equal(live.reserved, 0n);
  assert.equal(live.avail, m.balance);
  await verify();

  // Availability (core/include/tollgate/tg_billing.h): the reservation is a Redis hold and
  // its Postgres row goes with the settlement batches, "so no request waits on
  // Postgres, and a Postgres outage does not stop traffic for tenants whose balance is
  // live in Redis" — this tenant's was (1.5 s of traffic before the outage).
  const during = results.filter((r) => r.t >= down && r.t <= up);
  assert.ok(during.length > 0, 'requests were sent during the outage');
  assert.deepEqual(tally(refused.map((r) => `${r.status} ${r.code}`)), {},
    `no request refused while Postgres was down (${during.length} sent during the outage)`);
});

test('Postgres goes away again while the spool is replayed: the replay is kept and retried, never dropped', async () => {
  const before = await count(bill, 'usage');
  const spooledBefore = spooled();
  // Six requests while Postgres is gone: reserved in Redis (the key served from the
  // cache), answered, and their reservation rows and settlements can only be spooled.
  // Postgres is stopped first: pg.stop() resolves once the postmaster has exited. (This
  // test used to stop it 400 ms into six 1.2 s requests; under load the stop — a bash
  // spawned, then the fast shutdown — took longer than that, the six settled into
  // Postgres before it went, nothing was spooled and the wait below timed out: CI on
  // f544423 and 5ca54ba.)
  await pg.stop();
  const rs = await Promise.all(Array.from({ length: 6 }, () => chat(gw, bill.key, chatBody('spooled [mock delay_ms=1200 chunks=3]', { maxTokens: 50 }), { timeout: 20000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 6 });
  await waitFor(() => spooled() >= spooledBefore + 12, { timeout: 15000, what: 'the 6 reservation rows and 6 settlements to be spooled' }).catch((e) => {
    throw new Error(`${e.message} (${spooled() - spooledBefore} spooled)\n${gw.proc.tail(20)}`);
  });
  await batcherIdle();

  // Postgres comes back, but the settlement tables are locked (a long maintenance
  // statement, say), so the replay waits on the server; then Postgres stops again.
  const replays = () => gw.proc.lines.stderr.filter((l) => /replaying/.test(l)).length;
  const replaysBefore = replays();
  await pg.start();
  const locker = spawn('psql', ['-X', '-q', '-d', bill.conninfo, '-c',
    'BEGIN; LOCK TABLE usage IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(60); COMMIT;'],
  { stdio: 'ignore', env: { ...process.env, PGAPPNAME: 'tg-billing-locker' } });
  const lockerExit = new Promise((resolve) => locker.on('exit', resolve));
  try {
    await waitFor(() => replays() > replaysBefore, { timeout: 15000, interval: 20, what: 'the spool replay to start' });
    await sleep(200);
    await pg.stop();
  } finally {
    locker.kill('SIGKILL');
    await lockerExit;
  }
  await sleep(1000);
  await pg.start();

  await checkBilledOnce(rs.map((r) => r.headers['x-request-id']));
  assert.equal(await count(bill, 'usage'), before + 6);
  assert.equal(await count(bill, 'reservations', "state <> 'reconciled'"), 0);
  await verify();
});

/** SIGSTOPs (or SIGCONTs) this test's Postgres: its postmaster, by the PID in its
 *  pidfile, then each of its children (read from /proc), each by its PID. */
function signalPg(sig) {
  const pm = Number(fs.readFileSync(path.join(pg.dir, 'pgdata', 'postmaster.pid'), 'utf8').split('\n')[0]);
  const kids = fs.readdirSync('/proc').filter((d) => /^\d+$/.test(d)).filter((d) => {
    try {
      return Number(fs.readFileSync(`/proc/${d}/stat`, 'utf8').replace(/^.*\) /s, '').split(' ')[1]) === pm;
    } catch {
      return false;
    }
  }).map(Number);
  for (const pid of sig === 'SIGSTOP' ? [pm, ...kids] : [...kids, pm]) {
    try {
      process.kill(pid, sig);
    } catch { /* exited meanwhile */ }
  }
}

test('Postgres stops answering (SIGSTOP) with batches in flight and connects pending: each batch is spooled within the query timeout, nothing waits for Postgres', async () => {
  const before = await count(bill, 'usage');
  const spooledBefore = spooled();
  await batcherIdle();
  // Six requests reserve while Postgres answers; it hangs before they settle: the
  // sockets stay open and nothing comes back, so only the gateway's own deadline
  // (postgres_timeout_ms, 1 s here) can end their batches.
  const first = Array.from({ length: 6 }, () => chat(gw, bill.key, chatBody('spooled [mock delay_ms=1200 chunks=3]', { maxTokens: 50 }), { timeout: 20000 }));
  await sleep(300);
  signalPg('SIGSTOP');
  let resumed = false;
  try {
    const rs1 = await Promise.all(first);
    assert.deepEqual(tally(rs1.map((r) => r.status)), { 200: 6 });
    // Settled after the hang began: committed is impossible, so spooled (by the query
    // timeout of a batch on the wire, or a queued one's) — within a few seconds.
    await waitFor(() => spooled() >= spooledBefore + 6, { timeout: 8000, what: 'the 6 settlements to be spooled while Postgres hangs' }).catch((e) => {
      throw new Error(`${e.message} (${spooled() - spooledBefore} spooled)\n${gw.proc.tail(20)}`);
    });
    await batcherIdle(8000);
    // The pool is now reconnecting to a server that accepts and never answers: more
    // requests still settle into the spool, bounded by the same deadline.
    const spooledMid = spooled();
    const rs2 = await Promise.all(Array.from({ length: 3 }, () => chat(gw, bill.key, chatBody('spooled [mock delay_ms=1200 chunks=3]', { maxTokens: 50 }), { timeout: 20000 })));
    assert.deepEqual(tally(rs2.map((r) => r.status)), { 200: 3 });
    await waitFor(() => spooled() >= spooledMid + 6, { timeout: 8000, what: 'the 3 reservation rows and 3 settlements made during the hang to be spooled' }).catch((e) => {
      throw new Error(`${e.message} (${spooled() - spooledMid} spooled)\n${gw.proc.tail(20)}`);
    });
    await batcherIdle(8000);
    signalPg('SIGCONT');
    resumed = true;
    await checkBilledOnce([...rs1, ...rs2].map((r) => r.headers['x-request-id']), 30000);
    assert.equal(await count(bill, 'usage'), before + 9);
    assert.equal(await count(bill, 'reservations', "state <> 'reconciled'"), 0);
    await verify();
  } finally {
    if (!resumed) signalPg('SIGCONT');
  }
});

test('SIGTERM while Postgres hangs with a statement cancelled: the gateway exits at once, its settlements spooled, replayed by the next one', async () => {
  await batcherIdle();
  const spooledBefore = spooled();
  const before = await count(bill, 'usage');
  signalPg('SIGSTOP');
  let resumed = false;
  try {
    // Settled while Postgres hangs: their batches time out on the wire and the statements
    // are cancelled (a cancel request to a server that does not answer either).
    const rs = await Promise.all(Array.from({ length: 3 }, () => chat(gw, bill.key, chatBody('spooled [mock delay_ms=1200 chunks=3]', { maxTokens: 50 }), { timeout: 20000 })));
    assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 3 });
    await waitFor(() => spooled() >= spooledBefore + 3, { timeout: 8000, what: 'the 3 settlements to be spooled while Postgres hangs' });
    assert.ok(gw.proc.lines.stderr.some((l) => /query timed out .*cancelling/.test(l)), `a statement was cancelled\n${gw.proc.tail(20)}`);
    // A rolling restart during the hang: the gateway stops within its shutdown bounds
    // (no request in flight; the queue's batches end within postgres_timeout_ms), not
    // when Postgres answers the cancel requests.
    const t0 = Date.now();
    gw.proc.signal('SIGTERM');
    const exited = await Promise.race([gw.proc.exited.then(() => true), sleep(12000).then(() => false)]);
    assert.ok(exited, `the gateway exited within 12 s of SIGTERM while Postgres hangs (${Date.now() - t0} ms so far)\n${gw.proc.tail(20)}`);
    signalPg('SIGCONT');
    resumed = true;
    // The next gateway on the same spool replays them.
    gw = await startGateway();
    await checkBilledOnce(rs.map((r) => r.headers['x-request-id']), 30000);
    assert.equal(await count(bill, 'usage'), before + 3);
    await verify();
  } finally {
    if (!resumed) signalPg('SIGCONT');
  }
});
