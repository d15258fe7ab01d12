// A client that goes away is billed for what it got, never for the whole reservation:
// gone mid-stream -> the stream is cut upstream and the usage row is marked estimated,
// with the content events streamed so far as output; gone before the first token (a
// stream, or a plain request still waiting for its answer) -> output 0, estimated, the
// input estimate only. Either way the rest of the hold returns to the live balance and
// `ledger verify` passes. (Gone while the reservation itself is in flight:
// billing_redis_slow.test.mjs.)

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import {
  CRED,
  accountsMoney,
  billedSetup,
  chatBody,
  costOf,
  liveMoney,
  reservationFor,
  reservationRows,
  startBilledGateway,
  streamChat,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';

let mock;
let bill;
let gw;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({ mock, balance: '10' });
  gw = await startBilledGateway(bill, {}, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

/** Waits until the mock counted `n` aborted calls of the account's credential. */
async function upstreamAborted(n) {
  await waitFor(async () => ((await mock.stats()).credentials?.[CRED]?.aborted ?? 0) >= n, {
    timeout: 3000,
    what: `${n} aborted upstream call(s)`,
  });
}

/** Checks the money side of a settled abort: cost billed, the rest released. */
async function checkReleased(id, R, before) {
  const row = await waitUsageRow(bill, id);
  const [res] = await reservationRows(bill, id);
  assert.equal(res.amount, R, 'the reservation was the full bound');
  assert.equal(res.state, 'reconciled');
  assert.equal(res.settled_cost, row.cost);
  assert.ok(row.cost < R, `billed ${row.cost}, less than the reservation ${R}`);
  const m = await accountsMoney(bill);
  assert.equal(m.balance, before.balance - row.cost);
  const live = await liveMoney(bill);
  assert.equal(live.avail, before.balance - row.cost, 'the live balance lost the cost only');
  assert.equal(live.reserved, 0n, 'nothing held any more');
  return row;
}

test('client gone mid-stream: estimated usage, output = the content chunks streamed', async () => {
  await mock.reset();
  const body = chatBody('leave mid-stream [mock chunks=200 interval_ms=30]', { maxTokens: 500, stream: true });
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 500);
  const before = await accountsMoney(bill);
  const r = await streamChat(gw, bill.key, body, { abortAfterChunks: 10 });
  assert.equal(r.status, 200);
  assert.equal(r.aborted, true);
  assert.equal(r.chunks, 10);
  await upstreamAborted(1);

  const row = await checkReleased(r.requestId, R, before);
  assert.equal(row.estimated, true, 'marked estimated');
  assert.equal(row.status, 499, 'recorded as a client disconnect');
  assert.ok(row.output_tokens >= 10 && row.output_tokens <= 12,
    `output ${row.output_tokens} ~ the 10 chunks the client received (the stream had 200)`);
  assert.ok(row.input_tokens > 0 && row.input_tokens <= Math.floor(r.bytes / 3) + 1,
    `input ${row.input_tokens} is at most the reserved input bound`);
  assert.equal(row.cost, costOf(row.input_tokens, row.output_tokens));
  await verifyLedger(bill);
});

test('client gone before the first token of a stream: output 0, estimated, never the full reservation', async () => {
  await mock.reset();
  const body = chatBody('leave before the first token [mock ttft_ms=2000 chunks=50]', { maxTokens: 500, stream: true });
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 500);
  const before = await accountsMoney(bill);
  const r = await streamChat(gw, bill.key, body, { abortAfterMs: 200 });
  assert.equal(r.aborted, true);
  assert.equal(r.chunks, 0);
  await upstreamAborted(1);
  const id = r.requestId ?? (await bill.db.scalar("SELECT request_id FROM reservations ORDER BY created_at DESC LIMIT 1"));

  const row = await checkReleased(id, R, before);
  assert.equal(row.output_tokens, 0, 'no output billed');
  assert.equal(row.estimated, true);
  assert.equal(row.cost, costOf(row.input_tokens, 0), 'the input estimate only');
  await verifyLedger(bill);
});

test('client gone while a plain request waits for its answer: output 0, estimated', async () => {
  await mock.reset();
  const body = { ...chatBody('leave while waiting [mock delay_ms=2000 chunks=50]', { maxTokens: 500 }), stream: false };
  const R = reservationFor(Buffer.byteLength(JSON.stringify(body)), 500);
  const before = await accountsMoney(bill);
  const t0 = Date.now();
  const r = await streamChat(gw, bill.key, body, { abortAfterMs: 200 });
  assert.equal(r.aborted, true);
  assert.equal(r.status, 0, 'no response head before the client left');
  await upstreamAborted(1);
  assert.ok(Date.now() - t0 < 1500, 'the upstream call was cancelled, not run to its end');
  await sleep(100);
  const id = await bill.db.scalar("SELECT request_id FROM reservations ORDER BY created_at DESC LIMIT 1");

  const row = await checkReleased(id, R, before);
  assert.equal(row.output_tokens, 0);
  assert.equal(row.estimated, true);
  assert.equal(row.cost, costOf(row.input_tokens, 0));
  await verifyLedger(bill);
});
