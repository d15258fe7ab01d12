// scale (#21, item 4): readiness is separate from liveness. /healthz answers 200 while
// the process serves; /readyz answers 503 {"status":"starting"} until every worker has
// its first account snapshot, and 503 {"status":"draining"} from the first SIGTERM on —
// while the listeners still accept for limits.drain_delay_ms, so that a load balancer
// takes the instance out before it stops accepting. Then the listeners close and the
// requests in flight finish (an SDK stream started before the SIGTERM ends whole).

import assert from 'node:assert/strict';
import net from 'node:net';
import { spawn } from 'node:child_process';
import { after, before, test } from 'node:test';

import { HOST, fetchT, sleep, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { applyState, chat, chatReq, createDb, plainKey, startStateGateway } from './lib/db.mjs';

const KEY = plainKey('ready');
let db;
let mock;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 'acme' }],
    groups: [{ name: 'main' }],
    accounts: [{ name: 'acct', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-ready', groups: ['main'] }],
    keys: [{ name: 'k', tenant: 'acme', group: 'main', key: KEY }],
  });
});

after(async () => {
  await stopAll();
  await db?.drop();
});

async function probe(gw, p) {
  const r = await fetchT(`${gw.url}${p}`, { headers: { connection: 'close' } }, 3000);
  return { status: r.status, json: await r.json().catch(() => null), retryAfter: r.headers.get('retry-after') };
}

/** 1 when a TCP connection to the port is accepted, 0 when refused. */
function connects(port) {
  return new Promise((resolve) => {
    const s = net.connect({ host: HOST, port }, () => {
      s.destroy();
      resolve(1);
    });
    s.on('error', () => resolve(0));
  });
}

test('/readyz is 503 "starting" until the first account snapshot, while /healthz is 200', async () => {
  // The accounts table is locked: the workers cannot load their snapshot yet.
  const locker = spawn('psql', ['-X', '-q', '-d', db.conninfo, '-c',
    'BEGIN; LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(3); COMMIT;'], { stdio: 'ignore' });
  const lockerDone = new Promise((resolve) => locker.on('exit', resolve));
  try {
    await waitFor(async () => (await db.scalar(
      "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'accounts' AND l.granted AND l.mode = 'AccessExclusiveLock'")) === '1',
    { timeout: 5000, interval: 20, what: 'the lock on accounts' });
    const gw = await startStateGateway(db, { workers: 2, postgres_timeout_ms: 10000 }, { mock });
    assert.equal((await probe(gw, '/healthz')).status, 200, 'alive');
    const r = await probe(gw, '/readyz');
    assert.equal(r.status, 503);
    assert.deepEqual(r.json, { status: 'starting' });
    assert.equal(r.retryAfter, '1');
    await lockerDone;
    await waitFor(async () => (await probe(gw, '/readyz')).status === 200, { timeout: 10000, what: '/readyz 200' });
    // Every worker has its snapshot: ten fresh connections (any worker) are all ready, and a
    // request of a group's key is routed.
    for (let i = 0; i < 10; i++) assert.deepEqual((await probe(gw, '/readyz')).json, { status: 'ready' });
    assert.equal((await chat(gw, KEY, chatReq('mock-gpt'))).status, 200);
    await gw.stop();
  } finally {
    if (locker.exitCode === null) locker.kill('SIGKILL');
  }
});

test('SIGTERM: /readyz 503 "draining" at once, new requests still served during the drain delay, then the listeners close and a stream in flight ends whole', async () => {
  const gw = await startStateGateway(db, { workers: 2, limits: { drain_delay_ms: 1500, shutdown_timeout_ms: 8000 } }, { mock });
  await waitFor(async () => (await probe(gw, '/readyz')).status === 200, { timeout: 10000, what: '/readyz 200' });

  // A stream of 30 chunks, 100 ms apart (3 s), through the official SDK, started before the SIGTERM.
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ apiKey: KEY, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 20000 });
  const stream = await client.chat.completions.create({
    model: 'mock-gpt', stream: true, messages: [{ role: 'user', content: 'long [mock chunks=30 interval_ms=100]' }],
  });
  const streamed = (async () => {
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    return text;
  })();
  await sleep(200);

  const t0 = Date.now();
  gw.proc.signal('SIGTERM');
  await waitFor(async () => (await probe(gw, '/readyz').catch(() => ({}))).status === 503, { timeout: 1000, interval: 20, what: '/readyz 503' });
  const r = await probe(gw, '/readyz');
  assert.deepEqual(r.json, { status: 'draining' });
  assert.equal((await probe(gw, '/healthz')).status, 200, 'still alive while draining');
  // During the delay the instance still takes new connections and serves them.
  const during = await chat(gw, KEY, chatReq('mock-gpt'));
  assert.equal(during.status, 200, during.text);
  assert.ok(Date.now() - t0 < 1400, 'that request was served inside the drain delay');
  assert.equal(await connects(gw.port), 1);

  // After the delay: no new connection is accepted, the stream in flight goes on.
  await waitFor(async () => (await connects(gw.port)) === 0, { timeout: 3000, interval: 50, what: 'the listeners to close' });
  const closedAfter = Date.now() - t0;
  assert.ok(closedAfter >= 1400, `listeners closed ${closedAfter} ms after SIGTERM (drain_delay_ms 1500)`);
  const text = await streamed;
  assert.equal(text, Array.from({ length: 30 }, (_, i) => `tok${i + 1} `).join(''), 'the whole stream');
  const exit = await gw.proc.exited;
  assert.deepEqual(exit, { code: 0, signal: null });
  assert.ok(gw.proc.lines.stderr.some((l) => /drain delay over/.test(l)), gw.proc.tail(10));
});

test('a second SIGTERM during the drain delay closes the listeners at once', async () => {
  const gw = await startStateGateway(db, { workers: 1, limits: { drain_delay_ms: 30000 } }, { mock });
  gw.proc.signal('SIGTERM');
  await waitFor(async () => (await probe(gw, '/readyz').catch(() => ({}))).status === 503, { timeout: 1000, interval: 20, what: '/readyz 503' });
  const t0 = Date.now();
  gw.proc.signal('SIGTERM');
  const exit = await gw.proc.exited;
  assert.deepEqual(exit, { code: 0, signal: null });
  assert.ok(Date.now() - t0 < 3000, 'exited without waiting out the 30 s delay');
});
