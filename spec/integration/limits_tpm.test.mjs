// The tokens-per-minute bucket: each request is charged its estimate up front (prompt
// bytes / 4 + max_tokens) and corrected to the real usage once it ends. A key with a
// small TPM gets 429 tokens_limit_exceeded (with Retry-After) when the estimates of the
// requests in flight would overdraw it; requests that used little give the difference
// back; the tokens actually used never exceed the bucket plus its refill.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, startMock, stopAll } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, keyId, plainKey, redisCli, SUITE_REDIS, startStateGateway, tally } from './lib/db.mjs';

const TPM = 2000;
const MAX_TOKENS = 500;
const CRED = 'sk-limits-tpm';
const K = Object.fromEntries(['conc', 'seq', 'big', 't1', 't2'].map((n) => [n, plainKey(`tpm-${n}`)]));
let db;
let mock;
let gw;
let tenant;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme' }, { name: 'tpm-tenant' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 1000, groups: ['main'] }],
    keys: [
      { name: 'conc', tenant: 'acme', group: 'main', key: K.conc, tpm: TPM },
      { name: 'seq', tenant: 'acme', group: 'main', key: K.seq, tpm: TPM },
      { name: 'big', tenant: 'acme', group: 'main', key: K.big, tpm: TPM },
      { name: 't1', tenant: 'tpm-tenant', group: 'main', key: K.t1 },
      { name: 't2', tenant: 'tpm-tenant', group: 'main', key: K.t2 },
    ],
  });
  await db.exec("UPDATE tenants SET tpm = 1500 WHERE name = 'tpm-tenant'");
  tenant = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  gw = await startStateGateway(db, {}, { mock });
});

after(async () => {
  await stopAll();
  await db?.drop();
});

const body = (text, extra = {}) => chatReq(MODEL, text, { max_tokens: MAX_TOKENS, ...extra });
/** The gateway's estimate for a body: its bytes / 4 + max_tokens. */
const estimate = (b) => Math.floor(Buffer.byteLength(JSON.stringify(b)) / 4) + MAX_TOKENS;

test('in-flight estimates overdraw a small TPM: 429 tokens_limit_exceeded with Retry-After', async () => {
  await mock.reset();
  const bodies = Array.from({ length: 6 }, (_, i) => body(`slow ${i} [mock chunks=5 interval_ms=300]`, { stream: true }));
  const est = estimate(bodies[0]);
  const fits = Math.floor(TPM / est);
  assert.equal(fits, 3, `the arithmetic of this test: estimate ${est}`);
  const rs = await Promise.all(bodies.map((b) => chat(gw, K.conc, b, { timeout: 20000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: fits, 429: 6 - fits });
  for (const r of rs.filter((x) => x.status === 429)) {
    assert.equal(r.json?.error?.code, 'tokens_limit_exceeded');
    assert.equal(r.json?.error?.type, 'rate_limit_error');
    const ra = Number(r.headers['retry-after']);
    // The shortfall is under one estimate: at TPM/60 per second, a few seconds.
    assert.ok(ra >= 1 && ra <= Math.ceil((est * 60) / TPM), `Retry-After ${r.headers['retry-after']}`);
  }
  assert.equal((await mock.stats()).credentials[CRED].requests, fits, 'refused requests never reach the upstream');
});

test('each request is corrected to its real usage afterwards, so small requests keep flowing', async () => {
  const est = estimate(body('seq 0 [mock chunks=2]'));
  // Without the correction the 4th request would be refused (4 × estimate > TPM).
  assert.ok(4 * est > TPM);
  const used = [];
  for (let i = 0; i < 10; i++) {
    const r = await chat(gw, K.seq, body(`seq ${i} [mock chunks=2]`));
    assert.equal(r.status, 200, `request ${i}: ${r.text}`);
    used.push(r.json.usage.total_tokens);
  }
  // The key's buckets: "<rpm level> <tpm level> <ts>", levels in milli-tokens.
  const raw = await redisCli(SUITE_REDIS, 'GET', `{t:${tenant}}:b:k:${await keyId(db, 'seq')}`);
  const left = Number(raw.split(' ')[1]) / 1000;
  const spent = used.reduce((a, b) => a + b, 0);
  assert.ok(left >= TPM - spent - 1 && left <= TPM, `bucket ${left} after ${spent} real tokens (not ${10 * est} estimated)`);
});

test('the tokens actually used never exceed the bucket plus its refill', async () => {
  await mock.reset();
  const t0 = Date.now();
  const admitted = [];
  let refused = null;
  for (let i = 0; i < 12 && !refused; i++) {
    const r = await chat(gw, K.big, body(`big ${i} [mock chunks=400]`));
    if (r.status === 200) admitted.push(r.json.usage.total_tokens);
    else refused = r;
  }
  const elapsed = (Date.now() - t0) / 1000;
  assert.ok(refused, `a big spender is refused eventually (admitted ${admitted.length})`);
  assert.equal(refused.status, 429, refused.text);
  assert.equal(refused.json?.error?.code, 'tokens_limit_exceeded');
  const spent = admitted.reduce((a, b) => a + b, 0);
  assert.ok(admitted.length >= Math.floor(TPM / estimate(body('big 0 [mock chunks=400]'))), `admitted ${admitted.length}`);
  assert.ok(spent <= TPM + (TPM / 60) * elapsed + 1, `${spent} tokens used in ${elapsed.toFixed(1)} s with a TPM of ${TPM}`);
  assert.equal((await mock.stats()).credentials[CRED].requests, admitted.length);
});

test("a tenant's TPM holds across its keys", async () => {
  const bodies = Array.from({ length: 4 }, (_, i) => body(`tenant ${i} [mock chunks=3 interval_ms=300]`, { stream: true }));
  const est = estimate(bodies[0]);
  const fits = Math.floor(1500 / est);
  assert.equal(fits, 2);
  const rs = await Promise.all(bodies.map((b, i) => chat(gw, i % 2 ? K.t1 : K.t2, b, { timeout: 20000 })));
  assert.deepEqual(tally(rs.map((r) => r.status)), { 200: fits, 429: 4 - fits });
  assert.ok(rs.filter((r) => r.status === 429).every((r) => r.json?.error?.code === 'tokens_limit_exceeded'));
});
