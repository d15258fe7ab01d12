// usage (#18, items 1 and 5): usage rows live in day partitions of the request's start;
// `tollgate usage drop` drops the days past billing.usage_retention_days whole, and
// money is never lost with them — balances, spend, ledger totals and `tollgate ledger
// verify` are the same after the drop (the partition's totals carried forward, read by
// verify), a settlement replayed into the dropped day is refused ('expired', never
// billed twice), and the rollups of that day stay. A ledger partition dropped the same
// way (tg_partition_drop) leaves verify exact too.

import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import { after, before, test } from 'node:test';

import { startMock, stopAll } from './lib/harness.mjs';
import {
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  ledger,
  settleBatch,
  settlement,
  startBilledGateway,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';
import { chat, tool, toolConfig } from './lib/db.mjs';

let mock;
let bill;
let gw;
const DAY = 86400000;
const old = new Date(Date.now() - 10 * DAY);
const oldDay = old.toISOString().slice(0, 10);
const part = `usage_p${oldDay.replaceAll('-', '')}`;

/** A request id as the gateway makes them, started at `ms`. */
const idAt = (ms) => `${ms.toString(16).padStart(12, '0')}-${crypto.randomBytes(9).toString('hex')}`;
const config = () => toolConfig({ billing: { usage_retention_days: 3, ledger_retention_days: 3 } });

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '50' });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

test('a usage day past retention is dropped whole; balances, spend, rollups and ledger verify stay exact', async () => {
  // Ten days ago: three requests settled (as a spool replay would, straight through
  // tg_settle_batch), before the live balance is loaded into Redis.
  const oldIds = [0, 1, 2].map((i) => idAt(old.getTime() + i * 1000));
  const els = oldIds.map((id, i) => settlement(bill, { requestId: id, input: 10 + i, output: 20 }));
  const out = await settleBatch(bill.conninfo, els);
  assert.deepEqual(out.map((o) => o.outcome), ['settled', 'settled', 'settled']);
  // No partition covered that day: the rows waited in the DEFAULT one, and move into
  // the day's partition when it is made.
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM usage_default`), '3');
  assert.equal(await bill.db.scalar(`SELECT tg_partition_create('usage', '${part}', '${oldDay} 00:00+00',
    '${oldDay} 00:00+00'::timestamptz + interval '1 day')`), 't');
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM ${part}`), '3');
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM usage_default`), '0');
  // The same request again is still a duplicate after the move (the dedup followed it).
  assert.deepEqual((await settleBatch(bill.conninfo, [els[0]])).map((o) => o.outcome), ['duplicate']);

  gw = await startBilledGateway(bill, {}, { mock });
  const today = [];
  for (let i = 0; i < 4; i++) {
    const r = await chat(gw, bill.key, chatBody(`now ${i} [mock chunks=3]`));
    assert.equal(r.status, 200, r.text);
    today.push(r.headers['x-request-id']);
  }
  assert.match(today[0], /^[0-9a-f]{12}-[0-9a-f]{18}$/, 'request ids carry their start');
  for (const id of today) await waitUsageRow(bill, id);
  const started = Number(await bill.db.scalar(`SELECT extract(epoch FROM started_at) * 1000 FROM usage
    WHERE request_id = '${today[0]}'`));
  assert.ok(Math.abs(started - Date.now()) < 60000, 'started_at is the request start');
  await verifyLedger(bill);

  const before = await accountsMoney(bill);
  const oldCost = els.reduce((s, e) => s + costOf(e.input, e.output), 0n);
  const rollBefore = await bill.db.scalar(`SELECT requests || ' ' || cost FROM usage_hourly
    WHERE hour >= '${oldDay}' AND hour < '${oldDay}'::date + 1`);
  assert.match(rollBefore, /^3 /);

  const cfg = config();
  const list = await tool(['usage', 'partitions'], { db: bill.db, config: cfg, redis: null });
  assert.equal(list.code, 0, list.stderr);
  assert.match(list.stdout, new RegExp(`${part} +usage .*past retention`));
  assert.match(list.stdout, /usage_default +usage .* 0 /);
  const dry = await tool(['usage', 'drop', '--dry-run'], { db: bill.db, config: cfg, redis: null });
  assert.equal(dry.code, 0, dry.stderr);
  assert.match(dry.stdout, new RegExp(`would drop ${part} \\(usage\\)`));
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM ${part}`), '3', 'a dry run drops nothing');

  const drop = await tool(['usage', 'drop'], { db: bill.db, config: cfg, redis: null });
  assert.equal(drop.code, 0, drop.stderr + drop.stdout);
  assert.match(drop.stdout, new RegExp(`dropped ${part} \\(usage\\): 3 row\\(s\\)`));
  assert.equal(await bill.db.scalar(`SELECT to_regclass('${part}') IS NULL`), 't', 'the partition is gone');
  assert.equal(await bill.db.scalar(`SELECT count(*) FROM usage WHERE request_id IN ('${oldIds.join("','")}')`), '0');
  assert.equal(await bill.db.scalar('SELECT count(*) FROM usage'), String(today.length), "today's rows stay");

  assert.deepEqual(await accountsMoney(bill), before, 'balance and spend unchanged');
  assert.equal(await bill.db.scalar(`SELECT (sum(cost) * 1000000000)::bigint FROM usage_carried WHERE partition = '${part}'`),
    String(oldCost), 'the dropped rows\' cost carried forward');
  assert.equal(await bill.db.scalar(`SELECT requests || ' ' || cost FROM usage_hourly
    WHERE hour >= '${oldDay}' AND hour < '${oldDay}'::date + 1`), rollBefore, 'the rollups of the day stay');
  await verifyLedger(bill);

  // The dropped day's settlement replayed (a spool after its retention): not billed.
  assert.deepEqual((await settleBatch(bill.conninfo, [els[1]])).map((o) => o.outcome), ['expired']);
  assert.deepEqual(await accountsMoney(bill), before, 'a replay into a dropped day bills nothing');
  // Nor does rebuild touch the dropped day's rollups.
  const rb = await tool(['usage', 'rebuild'], { db: bill.db, config: cfg, redis: null });
  assert.equal(rb.code, 0, rb.stderr);
  assert.equal(await bill.db.scalar(`SELECT requests || ' ' || cost FROM usage_hourly
    WHERE hour >= '${oldDay}' AND hour < '${oldDay}'::date + 1`), rollBefore);

  // verify reads the carried totals: a carried cost that is wrong is a problem.
  await bill.db.exec(`UPDATE usage_carried SET cost = cost + 1 WHERE partition = '${part}'`);
  const bad = await ledger(bill, 'verify');
  assert.equal(bad.code, 1, bad.stdout);
  assert.match(bad.stdout, /PROBLEM usage debits in the ledger = usage costs/);
  await bill.db.exec(`UPDATE usage_carried SET cost = cost - 1 WHERE partition = '${part}'`);
  await verifyLedger(bill);

  // A ledger partition dropped (this month's legacy one, as retention would a past month):
  // its entries' totals carried per tenant and kind; balances and verify unchanged.
  const entries = await bill.db.scalar("SELECT count(*) FROM ledger");
  assert.equal(await bill.db.scalar("SELECT tg_partition_drop('ledger_legacy')"), entries);
  assert.equal(await bill.db.scalar('SELECT count(*) FROM ledger'), '0');
  assert.deepEqual(await accountsMoney(bill), before);
  await verifyLedger(bill);
  // and the gateway keeps settling on top of it
  const r = await chat(gw, bill.key, chatBody('after the drops [mock chunks=2]'));
  assert.equal(r.status, 200, r.text);
  await waitUsageRow(bill, r.headers['x-request-id']);
  await verifyLedger(bill);
});
