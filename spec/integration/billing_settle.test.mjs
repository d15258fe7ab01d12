// Two-phase metering, one request at a time: the seed example (a request reserves
// 3,000 tokens' worth, uses 2,400, and exactly the 600 it did not use comes back to
// the live balance, once), what a replayed settlement does (nothing), the output cap
// a request without max_tokens gets (sent upstream too, so the reservation is a real
// bound), and the group's rate multiplier on both the reservation and the bill.
//
// Prices here are 1.00 USD per million tokens in and out ("seed-gpt": one token =
// 1,000 nano-USD), and 1.00 / 2.00 for mock-gpt.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll } from './lib/harness.mjs';
import { chat } from './lib/db.mjs';
import {
  IN_NANO,
  PRICES,
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
  reservedBound,
  settleBatch,
  startBilledGateway,
  usageRow,
  usageRows,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';

const SEED = 'seed-gpt';
let mock;
let bill;
let gw;
const dbs = [];

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '10', prices: [PRICES, { model: SEED, input: '1.00', output: '1.00' }] });
  dbs.push(bill.db);
  gw = await startBilledGateway(bill, {}, { mock });
  // Loads the live balance into Redis, so the numbers below are read before and after.
  const r = await chat(gw, bill.key, chatBody('warm up [mock chunks=1]'));
  assert.equal(r.status, 200, r.text);
  await waitUsageRow(bill, r.headers['x-request-id']);
});

after(async () => {
  await stopAll();
  for (const db of dbs) await db.drop();
});

/** Everything a replayed settlement could change, in one comparable object. */
async function snapshot(b) {
  const m = await accountsMoney(b);
  const live = await liveMoney(b);
  return {
    balance: m.balance,
    spend: m.spend,
    keySpend: m.keySpend,
    avail: live.avail,
    reserved: live.reserved,
    usage: await count(b, 'usage'),
    ledger: await count(b, 'ledger'),
    dedup: await count(b, 'billing_dedup'),
    open: await count(b, 'reservations', "state <> 'reconciled'"),
  };
}

/**
 * A body whose reservation is exactly `reserve` tokens and whose actual usage is
 * exactly `actual` tokens (input + output) at the mock, with a delay so the test can
 * look at the hold while the request is in flight.
 */
function seedBody(reserve, actual) {
  // Fixed-width numbers keep the body length independent of the values chosen.
  const text = (chunks) => `the seed example, reserve then settle [mock delay_ms=800 chunks=${String(chunks).padStart(4, '0')}]`;
  const body = (chunks, maxTokens) => ({ model: SEED, messages: [{ role: 'user', content: text(chunks) }], max_tokens: maxTokens });
  const bytes = Buffer.byteLength(JSON.stringify(body(1000, 1000)));
  const estInput = Math.floor(bytes / 3) + 1;
  const chunks = actual - mockInputTokens(text(1000));
  const b = body(chunks, reserve - estInput);
  assert.equal(Buffer.byteLength(JSON.stringify(b)), bytes, 'fixed-width body');
  return b;
}

test('the seed example: reserve 3,000, actual 2,400 -> exactly 600 back to the live balance, once', async () => {
  const body = seedBody(3000, 2400);
  const R = 3000n * IN_NANO; // 0.003 USD
  const A = 2400n * IN_NANO;
  const before = await snapshot(bill);
  assert.equal(before.reserved, 0n, 'nothing held before');

  let id;
  const pending = chat(gw, bill.key, body).then((r) => {
    id = r.headers['x-request-id'];
    return r;
  });
  // While the upstream is working, the bound is held: avail down by R, reserved = R.
  let held;
  for (let i = 0; i < 60 && !held; i++) {
    const live = await liveMoney(bill);
    if (live.reserved === R) held = live;
    else await sleep(10);
  }
  assert.ok(held, 'the reservation of R was visible in Redis while the request ran');
  assert.equal(held.avail, before.avail - R, 'avail went down by exactly R while in flight');

  const r = await pending;
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.usage.prompt_tokens + r.json.usage.completion_tokens, 2400, 'the mock used 2,400 tokens');
  const row = await waitUsageRow(bill, id);
  assert.equal(row.input_tokens + row.output_tokens, 2400);
  assert.equal(row.cost, A, 'billed exactly the actual 2,400 tokens');
  assert.equal(row.estimated, false);
  assert.deepEqual((await reservationRows(bill, id)).map((x) => [x.attempt, x.state, x.amount, x.settled_cost]),
    [[1, 'reconciled', R, A]], 'one reservation of exactly R, reconciled at A');
  assert.deepEqual(await ledgerRows(bill, id), [{ kind: 'usage', amount: -A }]);

  const afterSettle = await snapshot(bill);
  assert.equal(afterSettle.avail, held.avail + (R - A), 'R - A (600) came back to the live balance');
  assert.equal(afterSettle.avail, before.avail - A, 'the live balance is down by exactly A');
  assert.equal(afterSettle.reserved, 0n, 'nothing is held any more');
  assert.equal(await liveReservation(bill, id), null, 'the Redis hold of the request is gone');
  assert.equal(afterSettle.balance, before.balance - A, 'Postgres balance debited A');
  assert.equal(afterSettle.spend, before.spend + A);
  assert.equal(afterSettle.keySpend, before.keySpend + A);

  // Nothing comes back a second time later on (no delayed second credit).
  await sleep(1500);
  assert.deepEqual(await snapshot(bill), afterSettle, 'unchanged 1.5 s later');

  // Replays change nothing: the reconciler (nothing is due) ...
  const rec = await ledger(bill, 'reconcile', ['--older-than-ms', '0']);
  assert.equal(rec.code, 0, rec.stderr);
  assert.match(rec.stdout, /0 request\(s\) settled/);
  assert.deepEqual(await snapshot(bill), afterSettle, 'unchanged after ledger reconcile');

  // ... and the same settlement sent to tg_settle_batch again, as a spool replay would.
  const fp = await bill.db.scalar(`SELECT fingerprint FROM billing_dedup WHERE request_id = '${id}'`);
  const again = {
    request_id: id, fingerprint: fp, tenant_id: bill.tenantId, api_key_id: bill.keyId, group_id: bill.groupId,
    account_id: bill.accountId, model: SEED, attempts: 1, input: row.input_tokens, output: row.output_tokens,
    cost: '0.002400000', estimated: false, status: 200,
  };
  assert.deepEqual(await settleBatch(bill.conninfo, [again, again]),
    [{ request_id: id, outcome: 'duplicate' }, { request_id: id, outcome: 'duplicate' }]);
  assert.deepEqual(await settleBatch(bill.conninfo, [{ ...again, output: 2, cost: '0.000010000', fingerprint: 'other' }]),
    [{ request_id: id, outcome: 'conflict' }], 'different numbers for a settled request: a conflict');
  assert.deepEqual(await snapshot(bill), afterSettle, 'unchanged after the replays');
  assert.equal((await usageRows(bill, id)).length, 1);

  await verifyLedger(bill);
});

test('no max_tokens: the configured cap (4096) is reserved and sent upstream; a stream is billed from its usage', async () => {
  const text = 'no cap given [mock chunks=7 interval_ms=60]';
  const body = chatBody(text, { maxTokens: null, stream: true });
  const bytes = Buffer.byteLength(JSON.stringify(body));
  const before = await snapshot(bill);

  const pending = chat(gw, bill.key, body);
  let held;
  for (let i = 0; i < 100 && !held; i++) {
    const live = await liveMoney(bill);
    if (live.reserved > before.reserved) held = live.reserved - before.reserved;
    else await sleep(5);
  }
  const r = await pending;
  assert.equal(r.status, 200, r.text);
  assert.doesNotMatch(r.text, /"usage":\{/, 'the client did not ask for usage, so it sees none');
  const upstream = JSON.parse((await mock.last()).body);
  // (an OpenAI chat account takes it as max_completion_tokens: issue #15, item 8)
  assert.equal(upstream.max_completion_tokens, 4096, 'the upstream was told the cap that was reserved');
  assert.equal(upstream.max_tokens, undefined);

  const id = r.headers['x-request-id'];
  const row = await waitUsageRow(bill, id);
  assert.equal(row.input_tokens, mockInputTokens(text));
  assert.equal(row.output_tokens, 7);
  assert.equal(row.cost, costOf(mockInputTokens(text), 7));
  assert.equal(row.estimated, false);
  // The bound is held in Redis while the stream runs (its reservation row, if its batch
  // came before the settlement's, says the same; settled in one batch, it has none).
  assert.equal(held, reservationFor(bytes, 4096), 'bound = (bytes/3 + 1) in + 4096 out');
  const rows = await reservationRows(bill, id);
  assert.ok(rows.every((x) => x.state === 'reconciled' && x.amount === held), JSON.stringify(rows, (k, v) => String(v)));

  const now = await snapshot(bill);
  assert.equal(now.avail, before.avail - row.cost, 'the live balance lost the cost only');
  assert.equal(now.balance, before.balance - row.cost);
  assert.equal(now.reserved, 0n);
  await verifyLedger(bill);
});

test("the group's rate multiplier scales the reservation and the bill", async () => {
  const b2 = await billedSetup({ mock, balance: '5', multiplier: 1.5 });
  dbs.push(b2.db);
  const gw2 = await startBilledGateway(b2, { workers: 1 }, { mock });
  const text = 'one and a half [mock chunks=9]';
  const body = chatBody(text, { maxTokens: 50 });
  const r = await chat(gw2, b2.key, body);
  assert.equal(r.status, 200, r.text);
  const id = r.headers['x-request-id'];
  const row = await waitUsageRow(b2, id);
  const base = costOf(mockInputTokens(text), 9);
  assert.equal(row.cost, (base * 3n) / 2n, `cost = 1.5 x ${base}`);
  assert.equal(await reservedBound(b2, id), (reservationFor(Buffer.byteLength(JSON.stringify(body)), 50) * 3n) / 2n);
  const m = await accountsMoney(b2);
  assert.equal(m.balance, 5_000_000_000n - row.cost);
  assert.equal((await liveMoney(b2)).avail, m.balance);
  await verifyLedger(b2);
  await gw2.stop();
});
