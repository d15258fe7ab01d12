// The end of a billed request in Redis (issue #17 "pipeline", goal 4), counted with
// MONITOR on a private redis-server: the limiter gives back the request's concurrency
// leases (the key's and the tenant's) and corrects its TPM estimate in one script
// (core/redis/release.lua), once per request; the account's concurrency slot, under its
// own hash tag {a:<id>}, goes back with one plain ZREM, not a script (it was an EVALSHA
// of a one-line script); the hold goes back by billing's settle.lua once the settlement is
// durable (not counted here: billing's). After the requests every lease and slot is gone
// and the TPM bucket holds what the requests really used, not their estimates.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';

import { REPO, startMock, stopAll } from './lib/harness.mjs';
import { applyState, chat, createDb, keyId, plainKey, redisCli, startRedis } from './lib/db.mjs';
import { CRED, PRICES, chatBody, startBilledGateway } from './lib/billing.mjs';

const KEY = plainKey('pend');
const TPM = 2000;
const N = 10;
let mock;
let redis;
let db;
let gw;
let tenant;
let account;

before(async () => {
  mock = await startMock();
  redis = await startRedis();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme', balance: '1000', concurrency: 50, tpm: 100000 }],
    groups: [{ name: 'g' }],
    accounts: [{ name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: CRED, concurrency: 4, groups: ['g'] }],
    keys: [{ name: 'k', tenant: 'acme', group: 'g', key: KEY, rpm: 100000, tpm: TPM, concurrency: 8 }],
    prices: [PRICES],
  }, { redis: redis.url });
  tenant = Number(await db.scalar("SELECT id FROM tenants WHERE name = 'acme'"));
  account = Number(await db.scalar("SELECT id FROM accounts WHERE name = 'up'"));
  gw = await startBilledGateway({ conninfo: db.conninfo, redis: redis.url, key: KEY }, { workers: 1 }, { mock });
});

after(async () => {
  await stopAll();
  await redis?.stop();
  await db?.drop();
});

/** Every command Redis runs from now on, as arrays of arguments (MONITOR). */
function monitor(sock) {
  const cmds = [];
  const c = net.createConnection(sock);
  let buf = '';
  c.on('data', (d) => {
    buf += d.toString('latin1');
    let i;
    while ((i = buf.indexOf('\r\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const args = [...line.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => m[1]);
      if (args.length) cmds.push(args);
    }
  });
  const ready = new Promise((resolve) => c.once('data', resolve));
  c.write('MONITOR\r\n');
  return { cmds, ready, stop: () => c.destroy() };
}

test('per request: one script gives back the leases and corrects the TPM; the account slot is a ZREM', async () => {
  const releaseSha = crypto.createHash('sha1').update(fs.readFileSync(path.join(REPO, 'core/redis/release.lua'))).digest('hex');
  for (let i = 0; i < 3; i++) assert.equal((await chat(gw, KEY, chatBody('warm [mock chunks=2]'))).status, 200);
  assert.equal(String(await redisCli(redis.url, 'SCRIPT', 'EXISTS', releaseSha)).trim(), '1', 'release.lua is loaded as it is in core/redis');
  const bucketKey = `{t:${tenant}}:b:k:${await keyId(db, 'k')}`;
  await redisCli(redis.url, 'DEL', bucketKey); // a full TPM bucket from here
  const m = monitor(redis.sock);
  await m.ready;
  const ids = [];
  let spent = 0;
  for (let i = 0; i < N; i++) {
    const r = await chat(gw, KEY, chatBody(`end ${i} [mock chunks=2]`));
    assert.equal(r.status, 200, r.text);
    ids.push(r.headers['x-request-id']);
    spent += r.json.usage.total_tokens;
  }
  await new Promise((r) => setTimeout(r, 500)); // the releases go out after the responses
  m.stop();
  const slotKey = `{a:${account}}:conc`;
  for (const id of ids) {
    const mine = m.cmds.filter((a) => a.slice(1).some((x) => x.includes(id)));
    const evalsha = mine.filter((a) => a[0].toLowerCase() === 'evalsha');
    assert.equal(evalsha.filter((a) => a[1] === releaseSha).length, 1, `${id}: one release.lua: ${JSON.stringify(mine)}`);
    assert.equal(evalsha.filter((a) => a[3] === slotKey).length, 1, `${id}: one account-slot script (taking it), none to give it back`);
    assert.equal(mine.filter((a) => a[0].toLowerCase() === 'zrem' && a[1] === slotKey && a[2] === id).length, 1,
      `${id}: the account slot goes back with one ZREM`);
  }
  // Everything went back, and the TPM bucket was corrected to the real usage.
  for (const k of [`{t:${tenant}}:conc:k:${await keyId(db, 'k')}`, `{t:${tenant}}:conc:t`, slotKey]) {
    assert.equal(Number(await redisCli(redis.url, 'ZCARD', k)), 0, `${k} is empty`);
  }
  const left = Number(String(await redisCli(redis.url, 'GET', bucketKey)).split(' ')[1]) / 1000;
  assert.ok(left >= TPM - spent - 1 && left <= TPM, `TPM bucket ${left} after ${spent} tokens really used`);
});
