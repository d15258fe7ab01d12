// The request-rate token bucket in Redis, with seed 003's example: a key with rpm 300
// (refill 5 per second) and a bucket of 20. Thirty truly simultaneous requests: exactly
// 20 are admitted and 10 refused with 429 and Retry-After; two seconds later about 10
// more fit. A tenant's bucket holds across all of its keys. The 429 is OpenAI-shaped,
// so the official SDK raises its RateLimitError with the code and Retry-After. An
// operator can set bursts and tenant limits with the admin API and with apply.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, RawConn, rawRequest, sleep, startMock, stopAll } from './lib/harness.mjs';
import { adminClient, applyState, chat, chatReq, createDb, keyId, plainKey, redisCli, stateFile, SUITE_REDIS, startStateGateway, tally, tool } from './lib/db.mjs';

const SEED_KEY = plainKey('seed');
const SDK_KEY = plainKey('sdk');
const TENANT_KEY_1 = plainKey('t1');
const TENANT_KEY_2 = plainKey('t2');
const CRED = 'sk-limits-rpm';
let db;
let mock;
let gw;
let ids;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'seed' }, { name: 'capped' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['main'] }],
    keys: [
      { name: 'seed', tenant: 'seed', group: 'main', key: SEED_KEY, rpm: 300 },
      { name: 'sdk', tenant: 'seed', group: 'main', key: SDK_KEY, rpm: 6 },
      { name: 't1', tenant: 'capped', group: 'main', key: TENANT_KEY_1 },
      { name: 't2', tenant: 'capped', group: 'main', key: TENANT_KEY_2 },
    ],
  });
  // Neither `apply` nor the admin API sets bursts or tenant limits: straight to the
  // table, before any gateway has read the keys.
  await db.exec("UPDATE api_keys SET rpm_burst = 20 WHERE name = 'seed'");
  await db.exec("UPDATE api_keys SET rpm_burst = 1 WHERE name = 'sdk'");
  await db.exec("UPDATE tenants SET rpm = 60, rpm_burst = 6 WHERE name = 'capped'");
  ids = {
    seed: await keyId(db, 'seed'),
    tenantSeed: Number(await db.scalar("SELECT id FROM tenants WHERE name = 'seed'")),
    tenantCapped: Number(await db.scalar("SELECT id FROM tenants WHERE name = 'capped'")),
  };
  gw = await startStateGateway(db, {}, { mock });
});

after(async () => {
  await stopAll();
  await db?.drop();
});

/**
 * n requests with `key`, each on its own connection, written in the same tick after
 * every connection is open. Resolves with the parsed responses.
 */
async function simultaneous(n, key, text = 'seed [mock chunks=1]') {
  const conns = await Promise.all(Array.from({ length: n }, () => RawConn.open(gw.port)));
  const bytes = rawRequest('POST', '/v1/chat/completions', { body: chatReq(MODEL, text), key, port: gw.port });
  for (const c of conns) c.sock.write(bytes);
  const res = await Promise.all(conns.map((c) => c.response(15000)));
  for (const c of conns) c.destroy();
  assert.ok(res.every(Boolean), 'every request got a response');
  return res;
}

// A key's token buckets: one string "<rpm level> <tpm level> <ts ms>", levels in
// milli-tokens, -1 when not tracked (see tg_limits.c).
const bucketKey = (tenant, key) => `{t:${tenant}}:b:k:${key}`;
const bucket = async (tenant, key) => {
  const raw = await redisCli(SUITE_REDIS, 'GET', bucketKey(tenant, key));
  const rpm = raw === '' ? -1 : Number(raw.split(' ')[0]);
  return rpm < 0 ? null : rpm / 1000;
};

test('seed example: bucket 20, refill 5/s, 30 simultaneous requests → exactly 20 admitted, 10 refused', async () => {
  await mock.reset();
  const res = await simultaneous(30, SEED_KEY);
  const statuses = tally(res.map((r) => r.status));
  assert.deepEqual(statuses, { 200: 20, 429: 10 }, JSON.stringify(statuses));
  for (const r of res.filter((x) => x.status === 429)) {
    assert.match(r.headers['retry-after'] || '', /^\d+$/, 'a 429 carries Retry-After in seconds');
    // One token refills in 200 ms: the earliest useful retry is the next second.
    assert.equal(r.headers['retry-after'], '1');
    assert.equal(r.json?.error?.code, 'rate_limit_exceeded');
  }
  assert.equal((await mock.stats()).credentials[CRED]?.requests, 20, 'only the admitted 20 reached the upstream');
  const t = await bucket(ids.tenantSeed, ids.seed);
  assert.ok(t !== null && t >= 0 && t < 1, `the bucket is empty, never negative (t = ${t})`);

  await sleep(2000);
  const res2 = await simultaneous(15, SEED_KEY);
  const ok = res2.filter((r) => r.status === 200).length;
  assert.ok(ok >= 9 && ok <= 11, `2 s at 5/s refill ≈ 10 admitted, got ${ok}: ${JSON.stringify(tally(res2.map((r) => r.status)))}`);
  assert.equal(res2.length - ok, res2.filter((r) => r.status === 429).length, 'the rest are 429');
  const t2 = await bucket(ids.tenantSeed, ids.seed);
  assert.ok(t2 >= 0 && t2 <= 20, `0 <= t <= B (t = ${t2})`);
});

test('the bucket never holds more than its capacity, however long the key is idle', async () => {
  // 20 s at 5/s would be 100 tokens; the bucket caps at 20. Fake the idle time by
  // moving the bucket's timestamp back instead of waiting.
  const k = bucketKey(ids.tenantSeed, ids.seed);
  const [rpm, tpm, ts] = (await redisCli(SUITE_REDIS, 'GET', k)).split(' ').map(Number);
  assert.ok(ts > 0, 'the bucket has a Redis-time timestamp');
  await redisCli(SUITE_REDIS, 'SET', k, `${rpm} ${tpm} ${ts - 20000}`, 'KEEPTTL');
  const res = await simultaneous(25, SEED_KEY);
  assert.deepEqual(tally(res.map((r) => r.status)), { 200: 20, 429: 5 });
});

test("a tenant's bucket holds across all of the tenant's keys", async () => {
  const res = await Promise.all([simultaneous(5, TENANT_KEY_1, 'tenant [mock chunks=1]'), simultaneous(5, TENANT_KEY_2, 'tenant [mock chunks=1]')]);
  const all = res.flat();
  assert.deepEqual(tally(all.map((r) => r.status)), { 200: 6, 429: 4 }, 'tenant bucket of 6 shared by both keys');
  for (const r of all.filter((x) => x.status === 429)) {
    assert.equal(r.json?.error?.code, 'rate_limit_exceeded');
    assert.ok(Number(r.headers['retry-after']) >= 1);
  }
});

test('the 429 is OpenAI-shaped: the official SDK raises RateLimitError with code and Retry-After', async () => {
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ apiKey: SDK_KEY, baseURL: gw.baseURL, maxRetries: 0, timeout: 10000 });
  const first = await client.chat.completions.create(chatReq(MODEL, 'sdk [mock chunks=2]'));
  assert.equal(first.choices[0].message.content, 'tok1 tok2 ');
  let err;
  try {
    await client.chat.completions.create(chatReq(MODEL, 'sdk again'));
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof OpenAI.RateLimitError, `RateLimitError, got ${err?.constructor?.name}: ${err?.message}`);
  assert.equal(err.status, 429);
  assert.equal(err.code, 'rate_limit_exceeded');
  assert.equal(err.type, 'rate_limit_error');
  assert.equal(typeof err.error?.message, 'string');
  // rpm 6: one token per 10 s.
  const ra = Number(err.headers.get('retry-after'));
  assert.ok(ra >= 9 && ra <= 10, `Retry-After ${ra} s (one token per 10 s)`);

  let streamErr;
  try {
    await client.chat.completions.create(chatReq(MODEL, 'sdk stream', { stream: true }));
  } catch (e) {
    streamErr = e;
  }
  assert.ok(streamErr instanceof OpenAI.RateLimitError, 'a refused stream fails before it starts');

  // The raw body: exactly {"error":{"message","type","code"}}, JSON content type.
  const raw = await chat(gw, SDK_KEY, chatReq(MODEL));
  assert.equal(raw.status, 429);
  assert.match(raw.headers['content-type'], /^application\/json/);
  assert.deepEqual(Object.keys(raw.json), ['error']);
  assert.deepEqual(Object.keys(raw.json.error).sort(), ['code', 'message', 'type']);
  assert.ok(raw.headers['x-request-id'], 'a refused request still carries x-request-id');
});

test('an operator sets bursts and tenant limits through the admin API', async () => {
  const admin = adminClient(gw);
  const kid = await keyId(db, 't1');
  const rk = await admin.patch(`/keys/${kid}`, { rpm: 600, rpm_burst: 3 });
  assert.equal(rk.status, 200, `PATCH key rpm_burst: ${rk.text}`);
  assert.equal(rk.json.rpm_burst, 3);
  const rt = await admin.patch(`/tenants/${ids.tenantCapped}`, { rpm: 600, rpm_burst: 100, tpm: 100000, concurrency: 50 });
  assert.equal(rt.status, 200, `PATCH tenant limits: ${rt.text}`);
  assert.deepEqual([rt.json.rpm, rt.json.rpm_burst, rt.json.tpm, rt.json.concurrency], [600, 100, 100000, 50]);
  // In force once every worker has dropped the cached key (milliseconds): a bucket of 3.
  await sleep(200);
  const res = await simultaneous(5, TENANT_KEY_1, 'api burst [mock chunks=1]');
  assert.deepEqual(tally(res.map((r) => r.status)), { 200: 3, 429: 2 });
});

test('an operator sets bursts and tenant limits with tollgate apply', async () => {
  const r = await tool(['apply', stateFile({
    tenants: [{ name: 'capped', rpm: 120, rpm_burst: 10, tpm: 50000, concurrency: 20 }],
    keys: [{ name: 't2', tenant: 'capped', group: 'main', key: TENANT_KEY_2, rpm: 60, rpm_burst: 4 }],
  })], { db });
  assert.equal(r.code, 0, `apply with limits: ${r.stderr}`);
  const [t] = await db.query("SELECT rpm, rpm_burst, tpm, concurrency FROM tenants WHERE name = 'capped'");
  assert.deepEqual(t, { rpm: 120, rpm_burst: 10, tpm: 50000, concurrency: 20 });
  assert.equal(await db.scalar("SELECT rpm_burst FROM api_keys WHERE name = 't2'"), '4');
});
