// The first attempt's budget reservation is taken by the admission script itself: a
// billed request of a key with limits is checked against its RPM/TPM buckets and
// concurrency leases AND reserved against the tenant's balance and the key's budget in
// ONE Redis script call (one EVALSHA) before the upstream call. Redis MONITOR shows the
// commands that carry the request's id, with Redis's own timestamps, so the test counts
// the scripts sent before the first streamed chunk reached the client. While the stream
// runs, the reservation is where settlement and the reconciler look for it (the Redis
// reservation key, the holds index field, the `reserved` Postgres row). A balance or a
// key budget too small for the bound refuses with billing's 402 and leaves every bucket,
// lease and marker as it was. N parallel requests against a balance that covers k
// bounds: exactly k are admitted and the live balance never goes below zero.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, test } from 'node:test';

import { sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { SUITE_REDIS, applyState, chat, createDb, plainKey, redisCli, redisCliArgs, tally } from './lib/db.mjs';
import {
  CRED,
  MODEL,
  PRICES,
  chatBody,
  count,
  fmtNano,
  liveMoney,
  reservationFor,
  reservationRows,
  startBilledGateway,
  streamChat,
  verifyLedger,
  waitUsageRow,
} from './lib/billing.mjs';

const KEYS = { lim: plainKey('adm-lim'), budget: plainKey('adm-bud'), poor: plainKey('adm-poor') };
const OVERSPEND_BODY = chatBody('parallel [mock delay_ms=300 chunks=2]', { maxTokens: 500 });
const R_PAR = reservationFor(Buffer.byteLength(JSON.stringify(OVERSPEND_BODY)), 500);
const FITS = 7n;
const ORPHAN = 'orphan-model';

let mock;
let db;
let gw;
/** bill-shaped handles (lib/billing.mjs) of the two tenants' keys. */
let rich;
let budgetKey;
let poor;
let monitor;

/** `redis-cli monitor` on the suite's Redis: every command as Redis ran it. */
async function startMonitor(url) {
  const child = spawn('redis-cli', [...redisCliArgs(url), 'monitor'], { stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = [];
  let pending = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (s) => {
    pending += s;
    const parts = pending.split('\n');
    pending = parts.pop();
    lines.push(...parts);
  });
  await waitFor(() => lines.includes('OK'), { timeout: 5000, what: 'redis-cli monitor to start' });
  return {
    lines,
    /** Script calls (EVALSHA, or EVAL after NOSCRIPT) whose arguments contain `needle`:
     *  [{ms, text}], ms = Redis's time of the call. */
    scripts(needle) {
      return lines
        .filter((l) => /^\d+\.\d+ \[.*?\] "(EVALSHA|EVAL|evalsha|eval)" /.test(l) && l.includes(needle))
        .map((l) => ({ ms: Number(l.slice(0, l.indexOf(' '))) * 1000, text: l }));
    },
    stop: () => child.kill('SIGTERM'),
  };
}

before(async () => {
  mock = await startMock();
  db = await createDb();
  // Tenant `acme` (plenty of money) has limits of its own, so the tenant's scope is in the
  // script too; `poor` has money for exactly FITS parallel bounds. The account has no
  // concurrency cap, so no account-slot script runs: the only scripts before the upstream
  // call are the gateway's admission (and, today, reservation) scripts.
  await applyState(db, {
    tenants: [
      { name: 'acme', balance: '100', rpm: 100000, tpm: 100000000, concurrency: 1000 },
      { name: 'poor', balance: fmtNano(FITS * R_PAR) },
    ],
    groups: [{ name: 'g', models: [] }],
    // The account serves MODEL only: ORPHAN is priced (so it is reserved) but no account
    // can serve it.
    accounts: [{ name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 0, groups: ['g'], models: [MODEL] }],
    keys: [
      { name: 'lim', tenant: 'acme', group: 'g', key: KEYS.lim, rpm: 100000, tpm: 100000000, concurrency: 500 },
      { name: 'bud', tenant: 'acme', group: 'g', key: KEYS.budget, rpm: 100000, concurrency: 500, budget: '0.001' },
      { name: 'poor', tenant: 'poor', group: 'g', key: KEYS.poor, rpm: 100000, concurrency: 500 },
    ],
    prices: [PRICES, { ...PRICES, model: ORPHAN }],
  });
  const [ids] = await db.query(`SELECT (SELECT id FROM tenants WHERE name = 'acme') AS acme,
    (SELECT id FROM tenants WHERE name = 'poor') AS poor, (SELECT id FROM api_keys WHERE name = 'lim') AS lim,
    (SELECT id FROM api_keys WHERE name = 'bud') AS bud, (SELECT id FROM api_keys WHERE name = 'poor') AS poork`);
  const base = { db, conninfo: db.conninfo, redis: SUITE_REDIS, cred: CRED };
  rich = { ...base, key: KEYS.lim, tenantId: ids.acme, keyId: ids.lim };
  budgetKey = { ...base, key: KEYS.budget, tenantId: ids.acme, keyId: ids.bud };
  poor = { ...base, key: KEYS.poor, tenantId: ids.poor, keyId: ids.poork };
  gw = await startBilledGateway(rich, {}, { mock });
  monitor = await startMonitor(SUITE_REDIS);
});

after(async () => {
  monitor?.stop();
  await stopAll();
  await db?.drop();
});

/** The Redis state a refused admission must leave alone, for key `b`. */
async function limiterState(b) {
  const t = `{t:${b.tenantId}}`;
  const [keyBuckets, tenantBuckets, keyLeases, tenantLeases, money, kmoney] = await Promise.all([
    redisCli(b.redis, 'GET', `${t}:b:k:${b.keyId}`),
    redisCli(b.redis, 'GET', `${t}:b:t`),
    redisCli(b.redis, 'ZCARD', `${t}:conc:k:${b.keyId}`),
    redisCli(b.redis, 'ZCARD', `${t}:conc:t`),
    redisCli(b.redis, 'HGETALL', `${t}:money`),
    redisCli(b.redis, 'HGETALL', `${t}:kmoney:${b.keyId}`),
  ]);
  return { keyBuckets, tenantBuckets, keyLeases, tenantLeases, money, kmoney };
}

/** What a refused request `id` of key `b` must not have left in Redis. */
async function traces(b, id) {
  const t = `{t:${b.tenantId}}`;
  return {
    marker: await redisCli(b.redis, 'EXISTS', `${t}:a:${id}`),
    reservation: await redisCli(b.redis, 'EXISTS', `${t}:res:${id}:1`),
    hold: await redisCli(b.redis, 'HEXISTS', `${t}:holds`, `${id}:1`),
  };
}

test('the first request loads the live balance from Postgres and is admitted again, by the admission script only', async () => {
  assert.equal((await liveMoney(rich)).avail, null, 'the balance is not in Redis yet');
  const r = await chat(gw, rich.key, chatBody('first [mock chunks=2]'));
  assert.equal(r.status, 200, r.text);
  const id = r.headers['x-request-id'];
  await waitUsageRow(rich, id);
  // The script answered 'init' (having written nothing, its marker gone), the gateway
  // loaded the balance and ran the admission again: it admitted (the marker's SET NX
  // did not take the retry for a duplicate) and reserved. No separate reservation
  // script ran: every script call naming this request's reservation is an admission
  // (it names the request's marker too).
  await sleep(100);
  const res = monitor.scripts(`{t:${rich.tenantId}}:res:${id}:1`);
  const admissions = res.filter((s) => s.text.includes(`"{t:${rich.tenantId}}:a:${id}"`));
  assert.ok(admissions.length >= 2, `the admission ran twice (init, then admitted): ${res.length} calls`);
  // Settlement's script names the reservation too, but neither the marker nor a hold
  // value ("<key id>|<instance>|..."), which the separate reservation script sends.
  const separate = res.filter((s) => !admissions.includes(s) && s.text.includes(`"${rich.keyId}|`));
  assert.deepEqual(separate, [], 'no separate reservation');
  assert.ok(res.length > admissions.length, 'the settlement names it afterwards');
  // Its reservation row, if its batch came before the settlement's; settled in the same
  // batch, it has none (sql/0017): either way nothing is left open.
  const rows = await reservationRows(rich, id);
  assert.ok(rows.length <= 1 && rows.every((x) => x.state === 'reconciled'), JSON.stringify(rows, (k, v) => String(v)));
  const live = await liveMoney(rich);
  assert.ok(live.avail !== null && live.reserved === 0n, `the balance is live: ${JSON.stringify(live, (k, v) => String(v))}`);
});

test('a billed request with limits makes exactly ONE script call before the upstream call; the hold is in place while it streams', async () => {
  await mock.reset();
  const body = chatBody('one round trip [mock chunks=8 interval_ms=400]', { maxTokens: 200 });
  const R = reservationFor(Buffer.byteLength(JSON.stringify({ stream: true, ...body })), 200);
  const t = `{t:${rich.tenantId}}`;
  let firstChunkMs = 0;
  let inflight;
  const out = await streamChat(gw, rich.key, body, {
    onChunk: (n, o) => {
      if (n !== 1) return;
      firstChunkMs = Date.now();
      const id = o.requestId;
      // While the stream runs: the reservation where settlement and the reconciler
      // look for it, and the concurrency lease, both taken by that one script.
      inflight = (async () => {
        const seen = {
          reservation: await redisCli(rich.redis, 'GET', `${t}:res:${id}:1`),
          hold: await redisCli(rich.redis, 'HGET', `${t}:holds`, `${id}:1`),
          lease: await redisCli(rich.redis, 'ZSCORE', `${t}:conc:k:${rich.keyId}`, id),
          tenantLease: await redisCli(rich.redis, 'ZSCORE', `${t}:conc:t`, id),
          marker: await redisCli(rich.redis, 'EXISTS', `${t}:a:${id}`),
        };
        await waitFor(async () => (await reservationRows(rich, id)).length === 1, { timeout: 2500, what: 'the reserved row' });
        seen.row = (await reservationRows(rich, id))[0];
        seen.usageRows = await count(rich, 'usage', `request_id = '${id}'`);
        return seen;
      })();
    },
  });
  assert.equal(out.status, 200);
  assert.equal(out.chunks, 8);
  const id = out.requestId;
  const seen = await inflight;
  assert.equal(BigInt(seen.reservation), R, 'the Redis reservation holds the bound');
  const hold = seen.hold.split('|');
  assert.equal(hold.length, 5, `the holds index field: ${seen.hold}`);
  assert.equal(hold[0], String(rich.keyId));
  assert.equal(BigInt(hold[3]), R);
  assert.equal(hold[4], MODEL);
  assert.ok(seen.lease !== '', 'the key lease is held');
  assert.ok(seen.tenantLease !== '', 'the tenant lease is held');
  assert.equal(seen.marker, '1');
  assert.equal(seen.row.state, 'reserved', 'the Postgres row is written while the stream runs');
  assert.equal(seen.row.amount, R);
  assert.equal(seen.usageRows, 0, 'not settled yet');

  await waitUsageRow(rich, id);
  await sleep(200);
  const calls = monitor.scripts(id);
  const before = calls.filter((c) => c.ms <= firstChunkMs);
  assert.equal(before.length, 1, `one script call before the upstream call:\n${before.map((c) => c.text).join('\n')}`);
  const one = before[0].text;
  assert.match(one, /^\S+ \[.*?\] "EVALSHA" /, 'by its SHA: the script is cached');
  for (const key of [`${t}:a:${id}`, `${t}:b:k:${rich.keyId}`, `${t}:conc:k:${rich.keyId}`, `${t}:b:t`, `${t}:conc:t`,
    `${t}:money`, `${t}:res:${id}:1`, `${t}:holds`]) {
    assert.ok(one.includes(`"${key}"`), `the one call names ${key}: ${one}`);
  }
  // The release of the lease and the settlement come after, as separate calls.
  assert.ok(calls.length > before.length, 'settlement and release follow');
  const rows = await reservationRows(rich, id);
  assert.deepEqual(rows.map((r) => [r.attempt, r.state, r.amount]), [[1, 'reconciled', R]]);
  assert.equal(await redisCli(rich.redis, 'HEXISTS', `${t}:holds`, `${id}:1`), '0', 'the hold is settled');
  assert.equal(await redisCli(rich.redis, 'EXISTS', `${t}:res:${id}:1`), '0');
});

test('a balance too small for the bound: 402 insufficient_balance, no bucket charged, no lease, no marker, no hold', async () => {
  await mock.reset();
  await waitFor(async () => (await limiterState(rich)).keyLeases === '0', { timeout: 5000, what: 'the earlier leases to go' });
  const beforeState = await limiterState(rich);
  assert.notEqual(beforeState.keyBuckets, '', 'the key has buckets from the earlier requests');
  // A bound of 2e11 nano-USD (200 USD) against a balance of under 100 USD.
  const r = await chat(gw, rich.key, chatBody('too big', { maxTokens: 100000000 }));
  assert.equal(r.status, 402, r.text);
  assert.equal(r.json?.error?.code, 'insufficient_balance', r.text);
  assert.equal(r.json.error.type, 'insufficient_quota');
  assert.equal(typeof r.json.error.message, 'string');
  const id = r.headers['x-request-id'];
  assert.ok(id);
  assert.deepEqual(await limiterState(rich), beforeState, 'buckets, leases and money are as they were');
  assert.deepEqual(await traces(rich, id), { marker: '0', reservation: '0', hold: '0' });
  assert.equal((await mock.stats()).total, 0, 'the upstream never saw it');
  await sleep(200);
  assert.equal(await count(rich, 'reservations', `request_id = '${id}'`), 0, 'no reservation row');
  assert.equal(await count(rich, 'usage', `request_id = '${id}'`), 0, 'no usage row');
  assert.equal(await count(rich, 'ledger', `request_id = '${id}'`), 0, 'no ledger row');
  // The refusal was one script call.
  assert.equal(monitor.scripts(id).length, 1);
  await sleep(100);
  assert.equal(monitor.scripts(id).length, 1);
});

test("a key budget too small: 402 budget_exceeded (after loading the key's budget), nothing charged or held", async () => {
  await mock.reset();
  const beforeState = await limiterState(budgetKey);
  assert.equal(beforeState.kmoney, '', "the key's budget is not in Redis yet");
  const r = await chat(gw, budgetKey.key, chatBody('over budget', { maxTokens: 1000 }));
  assert.equal(r.status, 402, r.text);
  assert.equal(r.json?.error?.code, 'budget_exceeded', r.text);
  assert.equal(r.json.error.type, 'insufficient_quota');
  const id = r.headers['x-request-id'];
  const afterState = await limiterState(budgetKey);
  assert.equal(afterState.kmoney, 'avail\n1000000', "the key's budget was loaded (1,000,000 nano-USD) and nothing taken");
  assert.deepEqual({ ...afterState, kmoney: '' }, beforeState, 'no bucket, lease or balance changed');
  assert.equal(afterState.keyBuckets, '', 'the key was never charged a request');
  assert.deepEqual(await traces(budgetKey, id), { marker: '0', reservation: '0', hold: '0' });
  assert.equal((await mock.stats()).total, 0);
  // A request within the budget is admitted.
  const ok = await chat(gw, budgetKey.key, chatBody('within [mock chunks=2]', { maxTokens: 100 }));
  assert.equal(ok.status, 200, ok.text);
  await waitUsageRow(budgetKey, ok.headers['x-request-id']);
});

test('no account can serve it: refused before the admission, nothing is charged, held or recorded', async () => {
  // The account is chosen before the admission (core/README.md, Pipeline), so a model
  // no account of the group serves is answered 503 before any limit is charged or any
  // money is reserved (it was admitted, reserved and given back before 6220d7a).
  await mock.reset();
  const before = await liveMoney(rich);
  const seenBefore = monitor.scripts(`{t:${rich.tenantId}}:`).length;
  const r = await chat(gw, rich.key, chatBody('nobody serves this', { model: ORPHAN }));
  assert.equal(r.status, 503, r.text);
  assert.equal(r.json?.error?.code, 'no_account_available', r.text);
  const id = r.headers['x-request-id'];
  // A request that is admitted next shows MONITOR has caught up with this one.
  const ok = await chat(gw, rich.key, chatBody('served [mock chunks=1]'));
  assert.equal(ok.status, 200, ok.text);
  await waitFor(() => monitor.scripts(`{t:${rich.tenantId}}:a:${ok.headers['x-request-id']}`).length >= 1,
    { timeout: 3000, what: 'the next request\'s admission in MONITOR' });
  assert.deepEqual(monitor.scripts(id).map((c) => c.text), [], 'no script call names the refused request');
  assert.ok(monitor.scripts(`{t:${rich.tenantId}}:`).length > seenBefore);
  const t = await traces(rich, id);
  assert.equal(t.reservation, '0');
  assert.equal(t.hold, '0');
  assert.equal(await count(rich, 'reservations', `request_id = '${id}'`), 0, 'no reservation row');
  assert.equal(await count(rich, 'usage', `request_id = '${id}'`), 0, 'no usage row');
  assert.equal((await mock.stats()).total, 1, 'the upstream saw only the served one');
  // The served one's hold goes back once it settles: the balance is whole but for it.
  await waitFor(async () => (await liveMoney(rich)).reserved === before.reserved, { timeout: 5000, what: 'the served request\'s hold to go back' });
});

test(`${30} parallel requests against a balance covering ${FITS} bounds: exactly ${FITS} admitted, the balance never negative`, async () => {
  await mock.reset();
  let watching = true;
  let minAvail = null;
  const watcher = (async () => {
    while (watching) {
      const { avail } = await liveMoney(poor);
      if (avail !== null && (minAvail === null || avail < minAvail)) minAvail = avail;
      await sleep(10);
    }
  })();
  const rs = await Promise.all(Array.from({ length: 30 }, () => chat(gw, poor.key, OVERSPEND_BODY, { timeout: 30000 })));
  watching = false;
  await watcher;
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: Number(FITS), 402: 30 - Number(FITS) });
  for (const r of rs.filter((x) => x.status === 402)) assert.equal(r.json?.error?.code, 'insufficient_balance', r.text);
  assert.equal((await mock.stats()).total, Number(FITS), 'the upstream saw exactly the admitted ones');
  assert.ok(minAvail !== null && minAvail >= 0n, `the live balance never went negative (min ${minAvail})`);
  for (let i = 0; i < 100 && (await count(poor, 'usage', `tenant_id = ${poor.tenantId}`)) < Number(FITS); i++) await sleep(50);
  assert.equal(await count(poor, 'usage', `tenant_id = ${poor.tenantId}`), Number(FITS));
  assert.equal(await count(poor, 'reservations', `tenant_id = ${poor.tenantId}`), Number(FITS), 'one reservation row per admitted request');
  // Every refused request gave its marker back and took no lease (the admitted ones'
  // leases go back when they end).
  await waitFor(async () => (await redisCli(poor.redis, 'ZCARD', `{t:${poor.tenantId}}:conc:k:${poor.keyId}`)) === '0',
    { timeout: 5000, what: 'no lease left' });
  for (const r of rs.filter((x) => x.status === 402)) {
    assert.deepEqual(await traces(poor, r.headers['x-request-id']), { marker: '0', reservation: '0', hold: '0' });
  }
  await waitFor(async () => (await liveMoney(poor)).reserved === 0n, { timeout: 5000, what: 'every hold settled' });
  await verifyLedger(rich);
});
