// The admission lifecycle seen from a client (issue 6, items 1 and 2):
//
//   - the TPM estimate (prompt bytes / 4 + the output bound) cannot be dodged: a
//     max_tokens of 2^63-1 with a large body charges the whole bucket (it used to wrap
//     to a negative estimate, charged as 0), and the Responses API's max_output_tokens
//     is the output bound, as billing reads it;
//   - a concurrency 429 (the wait queue timed out, or is full) carries a Retry-After
//     computed from the limit that refused: the average time this key's requests held a
//     slot divided by its concurrency limit (README "Limits").

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, keyId, plainKey, redisCli, request, SUITE_REDIS, startStateGateway } from './lib/db.mjs';

const CRED = 'sk-limits-lifecycle';
const K = Object.fromEntries(['huge', 'resp', 'conc'].map((n) => [n, plainKey(`life-${n}`)]));
const TPM = 1000;
const RESP_TPM = 5000;
const CONC = 2;
let db;
let mock;
let gw;
let tenant;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['main'] }],
    keys: [
      { name: 'huge', tenant: 'acme', group: 'main', key: K.huge, tpm: TPM },
      { name: 'resp', tenant: 'acme', group: 'main', key: K.resp, tpm: RESP_TPM },
      { name: 'conc', tenant: 'acme', group: 'main', key: K.conc, concurrency: CONC },
    ],
  });
  tenant = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  // One worker: the hold times behind a concurrency Retry-After are kept per worker.
  // Streams of up to 6 s: the harness's upstream idle timeout (5 s) is raised.
  gw = await startStateGateway(db, { workers: 1, limiter: { queue_max: 1, queue_timeout_ms: 300 }, upstream: { idle_timeout_ms: 30000 } }, { mock });
});

after(async () => {
  await stopAll();
  await db?.drop();
});

/** The key's TPM level in tokens, from its bucket string "<rpm> <tpm> <ts>" (milli-tokens). */
const tpmLevel = async (name) => {
  const raw = await redisCli(SUITE_REDIS, 'GET', `{t:${tenant}}:b:k:${await keyId(db, name)}`);
  return Number(raw.split(' ')[1]) / 1000;
};
const inflight = async () => (await mock.stats()).credentials[CRED]?.inflight ?? 0;

test('a max_tokens of 2^63-1 and a large body charge the whole TPM bucket, not nothing', async () => {
  // JSON numbers past 2^53 do not survive JSON.stringify: the body is spliced as text.
  const text = `huge [mock chunks=20 interval_ms=100] ${'x'.repeat(64 * 1024)}`;
  const body = JSON.stringify(chatReq(MODEL, text, { stream: true, max_tokens: '@MAX@' }))
    .replace('"@MAX@"', '9223372036854775807');
  const held = chat(gw, K.huge, body, { timeout: 20000 });
  await waitFor(async () => (await inflight()) === 1, { timeout: 5000, what: 'the huge request upstream' });
  assert.equal(await tpmLevel('huge'), 0, 'the estimate saturates: the whole bucket is charged');
  const small = await chat(gw, K.huge, chatReq(MODEL, 'small [mock chunks=1]', { max_tokens: 10 }));
  assert.equal(small.status, 429, small.text);
  assert.equal(small.json?.error?.code, 'tokens_limit_exceeded');
  const r = await held;
  assert.equal(r.status, 200, r.text.slice(0, 300));
  assert.equal((await mock.stats()).credentials[CRED].requests, 1, 'the refused request never went upstream');
});

test("the Responses API's max_output_tokens is the output bound of the TPM estimate", async () => {
  await mock.reset();
  const MAX_OUT = 3000;
  const body = JSON.stringify({ model: MODEL, input: 'responses [mock chunks=20 interval_ms=100]', stream: true, max_output_tokens: MAX_OUT });
  const est = Math.floor(Buffer.byteLength(body) / 4) + MAX_OUT;
  const held = request(`${gw.url}/v1/responses`, { method: 'POST', headers: { authorization: `Bearer ${K.resp}` }, body, timeout: 20000 });
  await waitFor(async () => (await inflight()) === 1, { timeout: 5000, what: 'the responses stream upstream' });
  assert.equal(await tpmLevel('resp'), RESP_TPM - est, `charged prompt/4 + max_output_tokens = ${est}`);
  // A second one does not fit next to it: 2 × est > RESP_TPM.
  const second = await request(`${gw.url}/v1/responses`, {
    method: 'POST',
    headers: { authorization: `Bearer ${K.resp}` },
    body: JSON.stringify({ model: MODEL, input: 'second [mock chunks=1]', max_output_tokens: MAX_OUT }),
  });
  assert.equal(second.status, 429, second.text);
  assert.equal(second.json?.error?.code, 'tokens_limit_exceeded');
  const r = await held;
  assert.equal(r.status, 200, r.text.slice(0, 300));
});

test('a concurrency 429 carries Retry-After = average slot hold time / the limit', async () => {
  await mock.reset();
  const stream = (tag, chunks) => {
    const t0 = Date.now();
    return chat(gw, K.conc, chatReq(MODEL, `${tag} [mock chunks=${chunks} interval_ms=100]`, { stream: true }), { timeout: 20000 })
      .then((r) => ({ status: r.status, ms: Date.now() - t0 }));
  };
  // History: two rounds of CONC requests that each hold a slot ~3 s.
  const held = [];
  for (let round = 0; round < 2; round++) {
    const rs = await Promise.all(Array.from({ length: CONC }, (_, i) => stream(`hist ${round} ${i}`, 30)));
    assert.ok(rs.every((r) => r.status === 200), JSON.stringify(rs));
    held.push(...rs.map((r) => r.ms));
  }
  const avg = held.reduce((a, b) => a + b, 0) / held.length;
  // The rule; the client's times include a few ms of HTTP around the hold.
  const want = Math.ceil(Math.min(60000, Math.max(1000, avg / CONC)) / 1000);
  assert.equal(want, 2, `the arithmetic of this test: ~3 s holds / ${CONC} slots (avg ${avg} ms)`);

  // Every slot taken by long streams; one more waits 300 ms in the queue (queue_max 1)
  // and is refused, the next finds the queue full.
  const long = Array.from({ length: CONC }, (_, i) => stream(`long ${i}`, 60));
  await waitFor(async () => (await inflight()) === CONC, { timeout: 5000, what: 'the slots taken' });
  const waited = chat(gw, K.conc, chatReq(MODEL, 'waits [mock chunks=1]'));
  await new Promise((r) => setTimeout(r, 50));
  const full = await chat(gw, K.conc, chatReq(MODEL, 'queue full [mock chunks=1]'));
  const timedOut = await waited;
  for (const [r, what] of [[timedOut, 'queue timeout'], [full, 'queue full']]) {
    assert.equal(r.status, 429, `${what}: ${r.text}`);
    assert.equal(r.json?.error?.code, 'concurrency_limit_exceeded', what);
    assert.equal(r.headers['retry-after'], String(want), `${what}: Retry-After`);
    assert.match(r.json.error.message, new RegExp(`retry after ${want} s`), what);
  }
  assert.match(full.json.error.message, /wait queue is full/);
  const ends = await Promise.all(long);
  assert.ok(ends.every((r) => r.status === 200), JSON.stringify(ends));
  assert.equal((await mock.stats()).credentials[CRED].max_inflight, CONC, 'never more than the limit upstream');
});
