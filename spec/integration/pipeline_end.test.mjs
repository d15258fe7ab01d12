// The end of a billed request in Redis (issue #17 "pipeline", goal 4), counted with
// MONITOR on a private redis-server: no script at all. The limiter gives back the
// request's concurrency leases (the key's and the tenant's) with one plain ZREM each; its
// TPM correction (estimate minus use) waits in the worker's table and goes with the next
// admission that reads the same bucket (admit.lua's correction arguments), or alone by
// core/redis/correct.lua 20 ms later when none comes; the account's concurrency slot,
// under its own hash tag {a:<id>}, goes back with one plain ZREM; the hold goes back by
// billing's settle.lua once the settlement is durable (not counted here: billing's).
// After the requests every lease and slot is gone and the TPM bucket holds what the
// requests really used, not their estimates. Before the upstream call, one script: the
// admission, which takes the account's slot too ("admit+slot", a single Redis).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

import { REPO, startMock, stopAll } from './lib/harness.mjs';
import { applyState, chat, createDb, keyId, plainKey, redisCli, redisMonitor, startRedis } from './lib/db.mjs';
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

function sha(name) {
  return crypto.createHash('sha1').update(fs.readFileSync(path.join(REPO, `core/redis/${name}.lua`))).digest('hex');
}

test('per request: no script at the end; the leases and the account slot go back with a ZREM each, the marker with a DEL, the TPM correction rides on the next admission', async () => {
  for (let i = 0; i < 3; i++) assert.equal((await chat(gw, KEY, chatBody('warm [mock chunks=2]'))).status, 200);
  await new Promise((r) => setTimeout(r, 300)); // the warm-up's corrections go out
  const bucketKey = `{t:${tenant}}:b:k:${await keyId(db, 'k')}`;
  const keyLeases = `{t:${tenant}}:conc:k:${await keyId(db, 'k')}`;
  const tenantLeases = `{t:${tenant}}:conc:t`;
  await redisCli(redis.url, 'DEL', bucketKey); // a full TPM bucket from here
  const m = redisMonitor(redis.sock);
  await m.ready;
  const ids = [];
  const used = [];
  for (let i = 0; i < N; i++) {
    const r = await chat(gw, KEY, chatBody(`end ${i} [mock chunks=2]`));
    assert.equal(r.status, 200, r.text);
    ids.push(r.headers['x-request-id']);
    used.push(r.json.usage.total_tokens);
  }
  await new Promise((r) => setTimeout(r, 500)); // the releases go out after the responses
  m.stop();
  const spent = used.reduce((a, b) => a + b, 0);
  const slotKey = `{a:${account}}:conc`;
  // admit.lua is sent with money.lua inside: it is told by its first key, the marker.
  const isAdmit = (a) => a[0].toLowerCase() === 'evalsha' && /^\{t:\d+\}:a:/.test(a[3]);
  const settleSha = sha('settle');
  for (const id of ids) {
    const mine = m.cmds.filter((a) => a.slice(1).some((x) => x.includes(id)));
    const evalsha = mine.filter((a) => a[0].toLowerCase() === 'evalsha' && a[1] !== settleSha); // settle: billing's, per batch
    assert.deepEqual(evalsha.map((a) => isAdmit(a) ? 'admit' : a[3] === slotKey ? 'slot' : a[1]), ['admit'],
      `${id}: one script, before the upstream: the admission: ${JSON.stringify(mine)}`);
    assert.equal(evalsha[0][3 + Number(evalsha[0][2]) - 1], slotKey, `${id}: the admission takes the account slot (its last key)`);
    const zrem = mine.filter((a) => a[0].toLowerCase() === 'zrem' && a[2] === id).map((a) => a[1]).sort();
    assert.deepEqual(zrem, [keyLeases, slotKey, tenantLeases].sort(), `${id}: its key lease, tenant lease and account slot go back with a ZREM each`);
    // Its marker (the admission's idempotency, 10 minutes of TTL) is deleted at the end,
    // not left behind: one key per request would stay that long.
    const marker = `{t:${tenant}}:a:${id}`;
    assert.deepEqual(mine.filter((a) => a[0].toLowerCase() === 'del' && a.includes(marker)).map((a) => a.slice(1)), [[marker]],
      `${id}: its marker is deleted, by a DEL of its own`);
    assert.equal(Number(await redisCli(redis.url, 'EXISTS', marker)), 0, `${marker} is gone`);
  }
  // The corrections: an admission carries the sum of those of its buckets that ended
  // before it was sent (arguments 9, the key's bucket, and 16, the tenant's, of
  // admit.lua, after EVALSHA, sha, numkeys and the keys); what no admission carried
  // within 20 ms went alone by correct.lua. Which way each went depends on timing (under
  // load a request comes more than 20 ms after the last); the sums do not: every
  // request's correction (its charge, argument 6 or 13, minus its use) arrives once.
  const admits = m.cmds.filter(isAdmit);
  assert.equal(admits.length, N);
  const arg = (a, i) => a[3 + Number(a[2]) + i - 1];
  const alone = m.cmds.filter((a) => a[0].toLowerCase() === 'evalsha' && a[1] === sha('correct'));
  const tenantBucket = `{t:${tenant}}:b:t`;
  for (const [bucket, carriedAt, chargeAt, limit] of [[bucketKey, 9, 6, TPM], [tenantBucket, 16, 13, 100000]]) {
    const owed = admits.reduce((sum, a, i) => sum + Number(arg(a, chargeAt)) - Math.min(used[i], limit) * 1000, 0);
    const carried = admits.map((a) => arg(a, carriedAt)).filter((x) => x !== '').map(Number);
    const sent = alone.filter((a) => a[3] === bucket).map((a) => Number(a[4]));
    assert.equal(carried.concat(sent).reduce((x, y) => x + y, 0), owed,
      `${bucket}: every correction arrives once (carried ${carried}, alone ${sent}, owed ${owed})`);
    assert.ok(sent.length >= 1, `${bucket}: the last one goes alone`);
  }
  assert.equal(m.cmds.filter((a) => a[0].toLowerCase() === 'evalsha' && a[1] === sha('release')).length, 0, 'release.lua is not used on this path');
  // Everything went back, and the TPM bucket was corrected to the real usage.
  for (const k of [keyLeases, tenantLeases, slotKey]) {
    assert.equal(Number(await redisCli(redis.url, 'EXISTS', k)), 0, `${k} is gone (empty)`);
  }
  const left = Number(String(await redisCli(redis.url, 'GET', bucketKey)).split(' ')[1]) / 1000;
  assert.ok(left >= TPM - spent - 1 && left <= TPM, `TPM bucket ${left} after ${spent} tokens really used`);
});
