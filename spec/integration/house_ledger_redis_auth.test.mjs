// `tollgate ledger` reads the Redis URL with the one parser the workers use (issue 16,
// item 2 d): against a Redis that requires a password, on a database other than 0, it
// logs in and selects that database, so `ledger verify` compares the live reserved
// totals the gateway really keeps there. Before, it connected without AUTH or SELECT,
// every read answered NOAUTH, and verify printed "ok" for totals it never saw; a wrong
// password went unnoticed the same way. The Redis here is a private redis-server with
// requirepass on 127.0.0.1, started and stopped by PID by this test.

import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { after, before, test } from 'node:test';

import OpenAI from 'openai';

import { freePort, sleep, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { MODEL, billedSetup, ledger, startBilledGateway, waitUsageRow } from './lib/billing.mjs';

const PASSWORD = 'h0use-s3cret';
const DB = 3;
let redis; // {proc, url, port}
let bill;

/** redis-cli against the private server, logged in, on database `db`. */
function cli(db, ...args) {
  return new Promise((resolve, reject) => {
    execFile('redis-cli', ['-h', '127.0.0.1', '-p', String(redis.port), '-a', PASSWORD, '--no-auth-warning', '-n', String(db), ...args],
      { timeout: 10000 }, (err, stdout, stderr) => (err ? reject(new Error(stderr || err.message)) : resolve(stdout.trim())));
  });
}

before(async () => {
  const port = await freePort();
  const dir = tempDir('redis-auth');
  const proc = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--requirepass', PASSWORD, '--save', '',
    '--appendonly', 'no', '--dir', dir, '--daemonize', 'no', '--logfile', ''], { stdio: 'ignore' });
  redis = { proc, port, url: `redis://:${PASSWORD}@127.0.0.1:${port}/${DB}` };
  await waitFor(async () => (await cli(0, 'PING').catch(() => '')) === 'PONG', { timeout: 10000, what: 'redis-server' });
  const mock = await startMock();
  bill = await billedSetup({ mock, balance: '10', redis: redis.url });
  const gw = await startBilledGateway(bill, { workers: 1 }, { mock });
  const openai = new OpenAI({ apiKey: bill.key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 30000 });
  for (const n of [2, 4]) {
    const { _request_id: id } = await openai.chat.completions.create({
      model: MODEL, max_tokens: 50, messages: [{ role: 'user', content: `auth [mock chunks=${n}]` }],
    });
    await waitUsageRow(bill, id);
  }
  await gw.stop();
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
  if (redis?.proc && redis.proc.exitCode === null) {
    process.kill(redis.proc.pid, 'SIGTERM');
    await Promise.race([once(redis.proc, 'exit'), sleep(5000)]);
  }
});

test('the gateway keeps the live balance in the URL\'s database, behind the password', async () => {
  const key = `{t:${bill.tenantId}}:money`;
  assert.notEqual(await cli(DB, 'HGET', key, 'avail'), '', 'the live balance is in database 3');
  assert.equal(await cli(0, 'EXISTS', key), '0', 'and not in database 0');
});

test('ledger verify logs in and selects the database: consistent totals verify', async () => {
  const r = await ledger(bill, 'verify');
  assert.equal(r.code, 0, r.stdout + r.stderr);
  assert.match(r.stdout, /^ok {3}Redis reserved totals match Postgres$/m);
});

test('ledger verify sees a live balance that differs from Postgres behind the password', async () => {
  const key = `{t:${bill.tenantId}}:money`;
  await cli(DB, 'HINCRBY', key, 'avail', '-1000');
  let r;
  try {
    r = await ledger(bill, 'verify');
  } finally {
    await cli(DB, 'HINCRBY', key, 'avail', '1000');
  }
  assert.equal(r.code, 1, `verify must fail (was: "ok", every read answered NOAUTH):\n${r.stdout}${r.stderr}`);
  assert.match(r.stdout, new RegExp(`PROBLEM Redis reserved totals match Postgres: tenant_id=${bill.tenantId} `));
  assert.equal((await ledger(bill, 'verify')).code, 0, 'consistent again');
});

test('a wrong password is a problem named without the password, never a quiet "ok"', async () => {
  const wrong = `redis://:not-${PASSWORD}@127.0.0.1:${redis.port}/${DB}`;
  const r = await ledger({ ...bill, redis: wrong }, 'verify');
  assert.equal(r.code, 1, r.stdout + r.stderr);
  assert.match(r.stdout, /PROBLEM Redis: cannot connect to compare reserved totals: 127\.0\.0\.1:\d+\/3: AUTH failed/);
  assert.doesNotMatch(r.stdout + r.stderr, /not-h0use/);
  assert.doesNotMatch(r.stdout, /^ok {3}Redis/m);
});
