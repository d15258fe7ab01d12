// The console login lockout is per client address (issue "hostile", item 8): wrong
// tokens from one address lock that address (429 too_many_attempts with Retry-After,
// the right token included), while the right token from another address still logs in.
// The client binds its side of the connection to 127.0.0.1 or 127.0.0.2 (both loopback).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';

import { ADMIN_TOKEN, HOST, sleep, startGateway, startMock, stopAll } from './lib/harness.mjs';

let gw;

before(async () => {
  const mock = await startMock();
  gw = await startGateway({}, { mock });
});

after(() => stopAll());

/** POST /admin/login from `from` (a local address); resolves {status, retry, json, cookie}. */
function login(token, from) {
  return new Promise((resolve, reject) => {
    const body = JSON.stringify({ token });
    const req = http.request({
      host: HOST, port: gw.port, path: '/admin/login', method: 'POST', localAddress: from, agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      timeout: 10000,
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { text += d; });
      res.on('end', () => {
        let json;
        try { json = JSON.parse(text); } catch { json = undefined; }
        resolve({ status: res.statusCode, retry: res.headers['retry-after'], json, cookie: res.headers['set-cookie'] });
      });
    });
    req.on('timeout', () => req.destroy(new Error('login timed out')));
    req.on('error', reject);
    req.end(body);
  });
}

test('wrong tokens lock only their own address; the right token from elsewhere still logs in', async () => {
  const A = '127.0.0.1';
  const B = '127.0.0.2';
  // More wrong tokens than the old global allowance of 20 a minute.
  const seen = [];
  for (let i = 0; i < 25; i++) seen.push((await login(`wrong-${i}`, A)).status);
  // The operator, elsewhere, is not locked out by them.
  const operator = await login(ADMIN_TOKEN, B);
  assert.equal(operator.status, 200, `the right token from another address: ${JSON.stringify(operator.json)}`);
  assert.deepEqual(seen.slice(0, 5), [401, 401, 401, 401, 401], `first answers: ${seen}`);
  assert.ok(seen.slice(5).every((s) => s === 429), `after five failures the address is locked: ${seen}`);

  // A locked address is refused even with the right token, and told when to come back.
  const locked = await login(ADMIN_TOKEN, A);
  assert.equal(locked.status, 429);
  assert.equal(locked.json?.error?.code, 'too_many_attempts');
  assert.match(locked.retry ?? '', /^[1-9][0-9]*$/);
  assert.ok(Number(locked.retry) <= 2, `the first lock is short: Retry-After ${locked.retry}`);
  assert.equal(locked.cookie, undefined);

  // Another address is not affected.
  const other = await login(ADMIN_TOKEN, B);
  assert.equal(other.status, 200, JSON.stringify(other.json));
  assert.match(other.json?.csrf ?? '', /^[0-9a-f]{64}$/);
  assert.ok(other.cookie?.some((c) => c.startsWith('tg_session=')));
  // ... not even by a few wrong tokens of its own.
  assert.equal((await login('wrong', B)).status, 401);
  assert.equal((await login(ADMIN_TOKEN, B)).status, 200);

  // The lock ends (Retry-After later); the next failure locks for twice as long.
  await sleep(Number(locked.retry) * 1000 + 200);
  const again = await login('still-wrong', A);
  assert.equal(again.status, 401);
  const longer = await login(ADMIN_TOKEN, A);
  assert.equal(longer.status, 429);
  assert.ok(Number(longer.retry) >= 3 && Number(longer.retry) <= 4, `doubled: Retry-After ${longer.retry}`);
  await sleep(Number(longer.retry) * 1000 + 200);
  // The right token after the lock logs in and clears the address.
  assert.equal((await login(ADMIN_TOKEN, A)).status, 200);
  for (let i = 0; i < 4; i++) assert.equal((await login(`wrong-after-${i}`, A)).status, 401);
});

test('failures from many addresses neither unlock a locked one nor lock anyone else', async () => {
  const A = '127.0.0.3';
  for (let i = 0; i < 5; i++) assert.equal((await login(`w-${i}`, A)).status, 401);
  const t0 = Date.now();
  assert.equal((await login(ADMIN_TOKEN, A)).status, 429);
  // 200 other loopback addresses (127.0.1.x), one wrong token each: each
  // gets its own 401, none is locked, and A's entry is not pushed out by them.
  for (let i = 0; i < 200; i++) {
    const r = await login('noise', `127.0.${1 + (i >> 8)}.${i & 255}`);
    assert.equal(r.status, 401, `noise ${i}`);
  }
  const r = await login(ADMIN_TOKEN, A);
  if (Date.now() - t0 < 1800) assert.equal(r.status, 429, 'A is still locked');
  assert.equal((await login(ADMIN_TOKEN, '127.0.0.4')).status, 200);
});
