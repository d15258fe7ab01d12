// Periodic budgets (#24), enforced in the admission script that reserves the balance:
//
//   - 50 concurrent requests over three gateway instances against a daily key budget that
//     covers exactly 10 reservations: exactly 10 reach the upstream, 40 get 402
//     budget_exceeded naming the budget and when it resets; the period's spend in Redis
//     never passes the budget; Postgres records the period's spend = the sum of its usage;
//     `ledger verify` passes.
//   - the refusal in each protocol's error shape (official SDKs: chat, responses, messages)
//     with Retry-After and the reset time.
//   - the period boundary (the gateways' clock shifted with billing.test_clock, never by
//     sleeping): a budget spent out in one day is available again the next day, exactly
//     once — the next day's period fills and refuses in turn; each period has its own
//     Redis key and its own Postgres row, and each adds up to its usage.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll } from './lib/harness.mjs';
import { adminClient, chat, redisCli, tally } from './lib/db.mjs';
import {
  billedSetup,
  chatBody,
  costOf,
  count,
  fmtNano,
  mockInputTokens,
  reservationFor,
  startBilledGateway,
  verifyLedger,
} from './lib/billing.mjs';

const TEXT = 'budget day [mock delay_ms=800 chunks=4]';
const BODY = chatBody(TEXT, { maxTokens: 1000 });
const R = reservationFor(Buffer.byteLength(JSON.stringify(BODY)), 1000);
const A = costOf(mockInputTokens(TEXT), 4);
const ZONE = 'Europe/Berlin';

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

/** Unix seconds of the start of the next calendar day in ZONE (from Postgres's clock). */
async function nextDayStart() {
  return Number(await bill.db.scalar(`SELECT extract(epoch FROM (date_trunc('day', now() AT TIME ZONE '${ZONE}')
    + interval '1 day') AT TIME ZONE '${ZONE}')::bigint`));
}

/** Three gateways whose budgets' clock reads `at` (Unix seconds) now. */
async function gateways(at, n = 3) {
  const offset = at - Math.floor(Date.now() / 1000);
  return Promise.all(Array.from({ length: n }, () => startBilledGateway(bill, { billing: { test_clock: true } },
    { mock, env: { TOLLGATE_TEST_CLOCK_OFFSET: String(offset) } })));
}

async function stopGateways(gws) {
  await Promise.all(gws.map((g) => g.stop()));
}

async function periodRows(budgetId) {
  return bill.db.query(`SELECT extract(epoch FROM p.period_start)::bigint AS start,
    (p.spend * 1000000000)::bigint::text AS spend,
    (SELECT (coalesce(sum(u.cost), 0) * 1000000000)::bigint::text FROM budget_usage u
      WHERE u.budget_id = p.budget_id AND u.period_start = p.period_start) AS usage_sum,
    (SELECT count(*) FROM budget_usage u WHERE u.budget_id = p.budget_id AND u.period_start = p.period_start) AS n
    FROM budget_periods p WHERE p.budget_id = ${budgetId} ORDER BY p.period_start`);
}

async function liveSpend(budgetId, start) {
  const v = await redisCli(bill.redis, 'GET', `{t:${bill.tenantId}}:bud:${budgetId}:${start}`);
  return v === '' ? null : BigInt(v);
}

async function waitUsage(n) {
  for (let i = 0; i < 200 && (await count(bill, 'usage')) < n; i++) await sleep(50);
  assert.equal(await count(bill, 'usage'), n, 'usage rows');
}

let budget;
let day1;

test('50 concurrent requests on three instances against a daily budget covering 10: exactly 10 go, none overspends', async () => {
  const admin = adminClient(await (await gateways(Math.floor(Date.now() / 1000), 1))[0]);
  budget = await admin.create('/budgets', {
    name: 'k-daily', api_key_id: Number(bill.keyId), amount: fmtNano(10n * R), period: 'day', timezone: ZONE,
  });
  assert.equal(budget.tenant_id, Number(bill.tenantId), 'a key budget belongs to the key\'s tenant');
  const next = await nextDayStart();
  day1 = next - 86400; // the period the clock below is in (no DST change around today is assumed away: checked)
  const gws = await gateways(next - 300);
  await mock.reset();

  let watching = true;
  let maxLive = 0n;
  const watcher = (async () => {
    while (watching) {
      const v = await liveSpend(budget.id, day1).catch(() => null);
      if (v !== null && v > maxLive) maxLive = v;
      await sleep(15);
    }
  })();
  const rs = await Promise.all(Array.from({ length: 50 }, (_, i) => chat(gws[i % 3], bill.key, BODY, { timeout: 30000 })));
  const statuses = tally(rs.map((r) => r.status));
  assert.deepEqual(statuses, { 200: 10, 402: 40 }, `statuses ${JSON.stringify(statuses)}`);
  for (const r of rs.filter((x) => x.status === 402)) {
    assert.equal(r.json?.error?.code, 'budget_exceeded', r.text);
    assert.equal(r.json.error.type, 'insufficient_quota');
    assert.match(r.json.error.message, /daily budget "k-daily"/);
    assert.match(r.json.error.message, /resets at/);
    assert.equal(Number(r.headers['x-tollgate-budget']), Number(budget.id));
    const reset = Date.parse(r.headers['x-tollgate-budget-reset']) / 1000;
    assert.equal(reset, next, 'it resets at the next midnight in the budget\'s zone');
    const ra = Number(r.headers['retry-after']);
    assert.ok(ra >= 1 && ra <= 301, `Retry-After ${ra}: the seconds until the reset`);
  }
  assert.equal((await mock.stats()).total, 10, 'the upstream saw exactly the 10 that were reserved');
  await waitUsage(10);
  watching = false;
  await watcher;
  assert.ok(maxLive <= 10n * R, `the period's live spend never passed the budget (max ${maxLive})`);
  // Settled by difference: the period holds the 10 actual costs, Postgres the same.
  await sleep(300);
  assert.equal(await liveSpend(budget.id, day1), 10n * A);
  const rows = await periodRows(budget.id);
  assert.deepEqual(rows.map((x) => [Number(x.start), BigInt(x.spend), BigInt(x.usage_sum), Number(x.n)]),
    [[day1, 10n * A, 10n * A, 10]]);
  const b = await admin.read(`/budgets/${budget.id}`);
  assert.equal(b.current.spend !== undefined, true);
  await verifyLedger(bill);
  await stopGateways(gws);
});

test('the refusal in each protocol\'s shape: OpenAI on chat and responses, Anthropic on messages', async () => {
  const next = await nextDayStart();
  const [gw] = await gateways(next - 200, 1);
  const { default: OpenAI, APIError } = await import('openai');
  const oa = new OpenAI({ apiKey: bill.key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 30000 });
  const big = 100000; // an output bound whose reservation does not fit what is left of the day
  for (const call of [
    () => oa.chat.completions.create({ model: 'mock-gpt', max_tokens: big, messages: [{ role: 'user', content: 'hi' }] }),
    () => oa.responses.create({ model: 'mock-gpt', max_output_tokens: big, input: 'hi' }),
  ]) {
    let err;
    try {
      await call();
    } catch (e) {
      err = e;
    }
    assert.ok(err instanceof APIError, String(err));
    assert.equal(err.status, 402);
    assert.equal(err.code ?? err.error?.code, 'budget_exceeded');
    assert.match(err.message, /budget "k-daily"/);
    assert.ok(Number(err.headers?.get?.('retry-after') ?? err.headers?.['retry-after']) >= 1);
  }
  const { default: Anthropic, APIError: AErr } = await import('@anthropic-ai/sdk');
  const an = new Anthropic({ apiKey: bill.key, baseURL: gw.url, maxRetries: 0, timeout: 30000 });
  let err;
  try {
    await an.messages.create({ model: 'mock-gpt', max_tokens: big, messages: [{ role: 'user', content: 'hi' }] });
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof AErr, String(err));
  assert.equal(err.status, 402);
  assert.equal(err.error?.type, 'error', 'the Anthropic error shape');
  assert.match(err.error?.error?.message ?? '', /budget "k-daily"/);
  assert.ok(Number(err.headers?.get?.('retry-after') ?? err.headers?.['retry-after']) >= 1);
  await gw.stop();
});

test('the day boundary resets the budget exactly once: the next day fills and refuses again', async () => {
  const next = await nextDayStart();
  const usage0 = await count(bill, 'usage');
  // Still day 1: 9 more fit (10R - 10A is 9 bounds), the 10th not.
  let gws = await gateways(next - 120, 2);
  await mock.reset();
  let rs = await Promise.all(Array.from({ length: 12 }, (_, i) => chat(gws[i % 2], bill.key, BODY, { timeout: 30000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 9, 402: 3 });
  await waitUsage(usage0 + 9);
  await stopGateways(gws);
  // Day 2 (the clock 30 s past midnight): the budget is whole again — once.
  gws = await gateways(next + 30, 2);
  rs = await Promise.all(Array.from({ length: 30 }, (_, i) => chat(gws[i % 2], bill.key, BODY, { timeout: 30000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 10, 402: 20 }, 'the new day covers 10 again, not more');
  for (const r of rs.filter((x) => x.status === 402)) {
    assert.equal(Date.parse(r.headers['x-tollgate-budget-reset']) / 1000, next + 86400, 'now it resets a day later');
  }
  await waitUsage(usage0 + 19);
  await stopGateways(gws);
  // An hour later, the same day 2: no second reset — what the 10 spent still counts, so
  // 9 fit, as on day 1 (a reset would let 10 through).
  gws = await gateways(next + 3600, 2);
  rs = await Promise.all(Array.from({ length: 12 }, (_, i) => chat(gws[i % 2], bill.key, BODY, { timeout: 30000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: 9, 402: 3 }, 'no second reset within the day');
  await waitUsage(usage0 + 28);
  await stopGateways(gws);
  await sleep(300);
  assert.equal(await liveSpend(budget.id, day1), 19n * A);
  assert.equal(await liveSpend(budget.id, next), 19n * A);
  const rows = await periodRows(budget.id);
  assert.deepEqual(rows.map((x) => [Number(x.start), BigInt(x.spend), BigInt(x.usage_sum), Number(x.n)]),
    [[day1, 19n * A, 19n * A, 19], [next, 19n * A, 19n * A, 19]], 'one row per period, each its usage\'s sum');
  const out = await verifyLedger(bill);
  assert.match(out, /budget/, out);
});
