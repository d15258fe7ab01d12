// Identities across a fleet (issue #19, item 5): three gateways (two workers each) on one
// Postgres and Redis, an OAuth account whose refresh token rotates at every use and an
// Entra ID account, tokens living 3 s, bounded load across the three for 8 s. At the
// mock: one token request per expiry (never two within half a lifetime: a refresh done
// twice would show as a pair, and a rotated refresh token sent twice as a reuse), none
// refused, the last rotated refresh token the live one (a request after the last token
// expired still works); every client request answered 200.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { fetchT, sleep, startMock, stopAll } from './lib/harness.mjs';
import { billedSetup, startBilledGateway } from './lib/billing.mjs';

const LIFETIME_MS = 3000;
const LOAD_MS = 8000;
const CONCURRENCY = 6;
const MAX_REQUESTS = 1500;
let mock, bill;
const gws = [];

async function mockIdentity(cfg) {
  const r = await fetchT(`${mock.url}/_mock/identity`, cfg ? { method: 'POST', body: JSON.stringify(cfg) } : {});
  assert.equal(r.status, 200);
  return r.json();
}

before(async () => {
  mock = await startMock();
  await mockIdentity({ lifetime_ms: LIFETIME_MS, rotate: true, refresh_tokens: ['rt-first'], clients: { 'app-1': 's-1' } });
  bill = await billedSetup({
    mock,
    prices: [{ model: 'm-oauth', input: '1.00', output: '2.00' }, { model: 'm-entra', input: '1.00', output: '2.00' }],
    accounts: [
      {
        name: 'oa', provider: 'openai', auth: 'oauth', base_url: `${mock.url}/v1`, credential: 'rt-first',
        models: ['m-oauth'], settings: { token_url: `${mock.url}/oauth2/token`, client_id: 'cli-1' },
      },
      {
        name: 'up', provider: 'azure', auth: 'entra', base_url: `${mock.url}/openai`, credential: 's-1',
        models: ['m-entra'], settings: { tenant_id: 't-1', client_id: 'app-1', authority: mock.url },
      },
    ],
  });
  for (let i = 0; i < 3; i++) gws.push(await startBilledGateway(bill, {}, { mock }));
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

async function call(gw, model) {
  const r = await fetchT(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${bill.key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi [mock chunks=2]' }] }),
  }, 15000);
  const text = await r.text();
  return { status: r.status, text };
}

test('three gateways, tokens expiring every 3 s under load: one token request per expiry, no request failed', async () => {
  const t0 = Date.now();
  const failures = [];
  let sent = 0;
  const loop = async (i) => {
    for (let n = 0; Date.now() - t0 < LOAD_MS && sent < MAX_REQUESTS; n++) {
      sent++;
      const r = await call(gws[(i + n) % 3], n % 2 ? 'm-oauth' : 'm-entra');
      if (r.status !== 200) failures.push(`${r.status} ${r.text.slice(0, 200)}`);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, (_, i) => loop(i)));
  assert.deepEqual(failures, [], `${failures.length} of ${sent} requests failed`);
  assert.ok(sent >= 60, `bounded load ran (${sent} requests)`);

  const id = await mockIdentity();
  assert.equal(id.refused, 0, 'no token request was refused');
  assert.equal(id.refresh_reuse, 0, 'no rotated-away refresh token was ever sent again');
  assert.equal(id.refresh_tokens.length, 1);
  const elapsed = Date.now() - t0;
  for (const grant of ['r', 'c']) {
    const at = id.issues.filter((x) => x.grant === grant).map((x) => x.at_ms);
    const gaps = at.slice(1).map((t, i) => t - at[i]);
    assert.ok(gaps.every((g) => g > LIFETIME_MS / 2), `${grant}: one token per expiry, gaps ${gaps.join(', ')} ms`);
    // A token is renewed a quarter of its life before it expires: one per ~0.6-0.75 lifetimes.
    const most = Math.ceil(elapsed / (LIFETIME_MS / 2)) + 1;
    assert.ok(at.length >= Math.floor(elapsed / LIFETIME_MS) && at.length <= most, `${grant}: ${at.length} tokens in ${elapsed} ms`);
  }
  assert.ok(id.expired_presented <= 2, `expired tokens reaching the upstream: ${id.expired_presented} (each renewed and retried)`);

  // The last rotated refresh token is the one stored: after the last token expired, a
  // request on each gateway still gets through (one refresh with it, for the fleet).
  await sleep(LIFETIME_MS + 200);
  for (const gw of gws) {
    const r = await call(gw, 'm-oauth');
    assert.equal(r.status, 200, r.text);
  }
  const end = await mockIdentity();
  assert.equal(end.refused, 0);
  assert.equal(end.by_grant.refresh_token, id.by_grant.refresh_token + 1, 'one refresh for the three gateways');
});
