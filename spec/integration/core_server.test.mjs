// The gateway as an HTTP server: health and metrics endpoints, the JSON access log on
// stdout, keep-alive and pipelining on one socket, the header and idle timeouts that
// shed slowloris clients, graceful SIGTERM with a stream in flight, and the TLS
// listener used by the OpenAI SDK.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { after, before, test } from 'node:test';

import {
  CLIENT_KEY, HOST, REPO, RawConn, UPSTREAM_KEY, chatBody, fetchT, mockDirect, openaiClient, parseMetrics,
  postJson, rawRequest, sleep, startGateway, startMock, stopAll, tempDir, waitFor,
} from './lib/harness.mjs';

const HEADER_TIMEOUT = 1000;
const IDLE_TIMEOUT = 3000;

let mock;
let gw;
let client;

before(async () => {
  mock = await startMock();
  gw = await startGateway({ limits: { header_timeout_ms: HEADER_TIMEOUT, idle_timeout_ms: IDLE_TIMEOUT } }, { mock, tls: true });
  client = await openaiClient(gw);
});

after(stopAll);

test('GET /healthz answers 200 without a key', async () => {
  const r = await fetchT(`${gw.url}/healthz`);
  assert.equal(r.status, 200);
  assert.ok(r.headers.get('x-request-id'));
  await r.arrayBuffer();
});

// ------------------------------------------------------------------- metrics

function sumOf(metrics, name, pred = () => true) {
  return metrics.filter((m) => m.name === name && pred(m.labels)).reduce((a, m) => a + m.value, 0);
}

async function scrape() {
  const r = await fetchT(`${gw.url}/metrics`, { headers: { connection: 'close' } });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type') ?? '', /^text\/plain/);
  const text = await r.text();
  return { text, metrics: parseMetrics(text) };
}

test('GET /metrics: Prometheus text with request, duration, TTFT and overhead metrics', async () => {
  const isChat = (l) => /chat/.test(l.route ?? '');
  const before_ = await scrape();
  const closeHdr = { headers: { connection: 'close' } };
  // Separate connections, so with several workers the requests land on different ones.
  for (let i = 0; i < 2; i++) {
    const r = await postJson(gw.url, '/v1/chat/completions', chatBody(`metrics ${i} [mock chunks=2]`), closeHdr);
    assert.equal(r.status, 200);
  }
  const s = await postJson(gw.url, '/v1/chat/completions', chatBody('metrics stream [mock chunks=3 ttft_ms=200]', { stream: true }), closeHdr);
  assert.equal(s.status, 200);
  const nf = await fetchT(`${gw.url}/v1/nope`, { headers: { authorization: `Bearer ${CLIENT_KEY}`, connection: 'close' } });
  assert.equal(nf.status, 404);
  await nf.arrayBuffer();
  const { text, metrics } = await scrape();

  for (const [name, type] of [['tollgate_requests_total', 'counter'], ['tollgate_request_duration_seconds', 'histogram'],
    ['tollgate_ttft_seconds', 'histogram'], ['tollgate_overhead_seconds', 'histogram']]) {
    assert.match(text, new RegExp(`^# TYPE ${name} ${type}$`, 'm'), `# TYPE ${name} ${type}`);
  }
  const reqs = metrics.filter((m) => m.name === 'tollgate_requests_total');
  assert.ok(reqs.length > 0);
  for (const m of reqs) assert.ok('route' in m.labels && 'status' in m.labels, `labels route, status: ${JSON.stringify(m.labels)}`);

  const delta = (name, pred) => sumOf(metrics, name, pred) - sumOf(before_.metrics, name, pred);
  assert.equal(delta('tollgate_requests_total', (l) => isChat(l) && l.status === '200'), 3,
    'chat/200 counted exactly once per request, across all workers');
  assert.ok(delta('tollgate_requests_total', (l) => l.status === '404') >= 1, 'the 404 is counted');

  for (const h of ['tollgate_request_duration_seconds', 'tollgate_ttft_seconds', 'tollgate_overhead_seconds']) {
    const inf = metrics.filter((m) => m.name === `${h}_bucket` && m.labels.le === '+Inf');
    assert.ok(inf.length > 0, `${h}_bucket{le="+Inf"}`);
    assert.ok(metrics.some((m) => m.name === `${h}_sum`), `${h}_sum`);
    assert.equal(sumOf(metrics, `${h}_bucket`, (l) => l.le === '+Inf'), sumOf(metrics, `${h}_count`), `${h}: +Inf bucket = count`);
  }
  assert.ok(delta('tollgate_request_duration_seconds_count', isChat) >= 3 ||
    delta('tollgate_request_duration_seconds_count') >= 3, 'durations observed');
  assert.ok(delta('tollgate_ttft_seconds_count') >= 1, 'the stream\'s TTFT observed');
  assert.ok(delta('tollgate_ttft_seconds_sum') >= 0.2, 'TTFT includes the upstream\'s 200 ms to first token');
  assert.ok(delta('tollgate_overhead_seconds_count') >= 3, 'overhead observed');
});

// ---------------------------------------------------------------- access log

function logLines() {
  return gw.proc.lines.stdout.filter((l) => l.trim() !== '');
}

async function logFor(requestId) {
  return waitFor(() => logLines().map((l) => JSON.parse(l)).find((o) => o.request_id === requestId),
    { timeout: 3000, what: `access log line for ${requestId}` });
}

test('access log: one JSON line per request on stdout with the contract fields', async () => {
  const body = chatBody('log me [mock chunks=5]');
  const res = await postJson(gw.url, '/v1/chat/completions', body);
  assert.equal(res.status, 200);
  const id = res.headers.get('x-request-id');
  assert.ok(id);
  const line = await logFor(id);
  assert.match(line.route, /chat[/_]completions/);
  assert.equal(line.status, 200);
  assert.ok('upstream' in line && line.upstream !== null, 'upstream named');
  assert.ok(line.bytes_in >= Buffer.byteLength(JSON.stringify(body)), `bytes_in ${line.bytes_in}`);
  assert.ok(line.bytes_out >= Buffer.byteLength(res.text), `bytes_out ${line.bytes_out}`);
  assert.equal(typeof line.ttft_ms, 'number');
  assert.equal(typeof line.total_ms, 'number');
  assert.ok(line.total_ms >= line.ttft_ms && line.ttft_ms >= 0);
  for (const k of ['input', 'output', 'cache_read', 'cache_write', 'reasoning']) assert.ok(k in line.usage, `usage.${k}`);
  assert.equal(line.usage.input, res.json.usage.prompt_tokens);
  assert.equal(line.usage.output, 5);
  assert.equal(logLines().filter((l) => l.includes(id)).length, 1, 'exactly one line for the request');
});

test('access log: a stream records its TTFT and the usage the client never asked for', async () => {
  const res = await postJson(gw.url, '/v1/chat/completions',
    chatBody('log my stream [mock chunks=4 interval_ms=50 ttft_ms=300]', { stream: true }));
  assert.equal(res.status, 200);
  const line = await logFor(res.headers.get('x-request-id'));
  assert.equal(line.status, 200);
  assert.ok(line.ttft_ms >= 280 && line.ttft_ms < 2000, `ttft_ms ${line.ttft_ms}`);
  assert.ok(line.total_ms >= line.ttft_ms + 100, `total_ms ${line.total_ms}`);
  assert.equal(line.usage.output, 4);
  assert.ok(line.usage.input > 0);
});

test('access log: errors are logged too; stdout holds nothing but JSON lines', async () => {
  const r = await postJson(gw.url, '/v1/chat/completions', chatBody('hi'), { key: 'tg-wrong' });
  assert.equal(r.status, 401);
  const line = await logFor(r.headers.get('x-request-id'));
  assert.equal(line.status, 401);
  for (const l of logLines()) {
    let o;
    assert.doesNotThrow(() => { o = JSON.parse(l); }, `stdout line is JSON: ${l.slice(0, 200)}`);
    assert.equal(typeof o.request_id, 'string');
  }
});

test('W3C traceparent is accepted and the trace continues upstream', async () => {
  const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
  const res = await postJson(gw.url, '/v1/chat/completions', chatBody('traced [mock chunks=1]'),
    { headers: { traceparent: `00-${traceId}-00f067aa0ba902b7-01` } });
  assert.equal(res.status, 200);
  assert.ok(res.headers.get('x-request-id'));
  const last = await mock.last();
  const tp = last.headers.traceparent;
  if (tp !== undefined) assert.match(tp, new RegExp(`^00-${traceId}-[0-9a-f]{16}-0[01]$`), 'same trace id upstream');
  assert.equal(last.headers.authorization, `Bearer ${UPSTREAM_KEY}`);
});

// ----------------------------------------------------- keep-alive, pipelining

test('keep-alive: two sequential requests on one socket', async () => {
  const c = await RawConn.open(gw.port);
  await c.write(rawRequest('GET', '/v1/models'));
  const r1 = await c.response(5000);
  assert.equal(r1?.status, 200);
  assert.equal(r1.json.object, 'list');
  assert.ok(!/close/i.test(r1.headers.connection ?? ''), 'not closed after the first response');
  await c.write(rawRequest('POST', '/v1/chat/completions', { body: chatBody('second on the socket [mock chunks=2]') }));
  const r2 = await c.response(5000);
  assert.equal(r2?.status, 200, `second response on the same socket (closed: ${c.closed})`);
  assert.equal(r2.json.usage.completion_tokens, 2);
  assert.notEqual(r1.headers['x-request-id'], r2.headers['x-request-id']);
  assert.ok(!c.closed);
  c.destroy();
});

test('pipelining: three requests written back to back are answered in order', async () => {
  const c = await RawConn.open(gw.port);
  await c.write(Buffer.concat([
    rawRequest('POST', '/v1/chat/completions', { body: chatBody('first, slow [mock chunks=3 delay_ms=300]') }),
    rawRequest('POST', '/v1/chat/completions', { body: chatBody('second, fast [mock chunks=6]') }),
    rawRequest('GET', '/healthz'),
  ]));
  const r1 = await c.response(5000);
  const r2 = await c.response(5000);
  const r3 = await c.response(5000);
  c.destroy();
  assert.equal(r1?.status, 200);
  assert.equal(r1.json.usage.completion_tokens, 3, 'first response belongs to the first request');
  assert.equal(r2?.status, 200, 'second pipelined request answered');
  assert.equal(r2.json.usage.completion_tokens, 6, 'second response belongs to the second request');
  assert.equal(r3?.status, 200, 'third pipelined request answered');
});

test('pipelining: a stream followed by a request on the same socket', async () => {
  const c = await RawConn.open(gw.port);
  await c.write(Buffer.concat([
    rawRequest('POST', '/v1/chat/completions', { body: chatBody('pipelined stream [mock chunks=4 interval_ms=30]', { stream: true }) }),
    rawRequest('GET', '/v1/models'),
  ]));
  const r1 = await c.response(5000);
  const r2 = await c.response(5000);
  c.destroy();
  assert.equal(r1?.status, 200);
  assert.match(r1.headers['content-type'], /event-stream/);
  assert.match(r1.text, /data: \[DONE\]/);
  assert.equal(r2?.status, 200);
  assert.equal(r2.json?.object, 'list');
});

test('HTTP/1.0 request is answered and the connection closed', async () => {
  const c = await RawConn.open(gw.port);
  await c.write('GET /healthz HTTP/1.0\r\n\r\n');
  const closed = await c.waitClose(3000);
  const r = await c.response(10);
  c.destroy();
  assert.equal(r?.status, 200);
  assert.ok(closed);
});

// ------------------------------------------------------------------ timeouts

test('slowloris: half-sent headers are cut after header_timeout_ms, others still served', async () => {
  const N = 20;
  const t0 = Date.now();
  const conns = [];
  for (let i = 0; i < N; i++) {
    const c = await RawConn.open(gw.port);
    await c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${CLIENT_KEY}\r\nX-Slow: `);
    conns.push(c);
  }
  // A well-behaved client is served at once meanwhile.
  const t1 = Date.now();
  const h = await fetchT(`${gw.url}/healthz`, { headers: { connection: 'close' } }, 2000);
  assert.equal(h.status, 200);
  assert.ok(Date.now() - t1 < 500, 'served while slow clients hang on');

  const results = await Promise.all(conns.map((c) => c.waitClose(HEADER_TIMEOUT + 2000)));
  assert.ok(results.every(Boolean), `${results.filter((x) => !x).length} of ${N} slow connections still open after ${HEADER_TIMEOUT + 2000} ms`);
  for (const c of conns) {
    const lived = c.closedAt - t0;
    assert.ok(lived >= HEADER_TIMEOUT - 150, `closed after ${lived} ms, not before header_timeout_ms`);
    const r = c.buf.length ? await c.response(10) : null;
    if (r) assert.ok([408, 400].includes(r.status), `status ${r.status}`);
    c.destroy();
  }
});

test('a connection that never sends a byte is closed', async () => {
  const c = await RawConn.open(gw.port);
  const closed = await c.waitClose(Math.max(HEADER_TIMEOUT, IDLE_TIMEOUT) + 2000);
  c.destroy();
  assert.ok(closed);
});

test('an idle keep-alive connection is closed after idle_timeout_ms', async () => {
  const c = await RawConn.open(gw.port);
  await c.write(rawRequest('GET', '/healthz'));
  assert.equal((await c.response(3000))?.status, 200);
  const t0 = Date.now();
  const closed = await c.waitClose(IDLE_TIMEOUT + 2000);
  const lived = Date.now() - t0;
  c.destroy();
  assert.ok(closed, 'closed');
  assert.ok(lived >= Math.min(IDLE_TIMEOUT, HEADER_TIMEOUT) - 150, `closed after ${lived} ms`);
});

// ---------------------------------------------------------------------- TLS

test('TLS listener: healthz over https with the self-signed CA', async () => {
  const { status, body } = await new Promise((resolve, reject) => {
    const req = https.get(`${gw.tlsUrl}/healthz`, { ca: gw.ca, timeout: 5000 }, (res) => {
      let b = '';
      res.on('data', (d) => { b += d; });
      res.on('end', () => resolve({ status: res.statusCode, body: b }));
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error('timeout')));
  });
  assert.equal(status, 200, body);
});

test('TLS listener: the OpenAI SDK (NODE_EXTRA_CA_CERTS) streams and completes over https', async () => {
  const dir = tempDir('tls');
  const caFile = path.join(dir, 'ca.pem');
  fs.writeFileSync(caFile, gw.ca);
  const expected = (await mockDirect(mock, chatBody('over tls [mock chunks=5 interval_ms=20]', { stream: true }))).content;
  const script = `
    import OpenAI from 'openai';
    const c = new OpenAI({ apiKey: ${JSON.stringify(CLIENT_KEY)}, baseURL: ${JSON.stringify(gw.tlsBaseURL)}, maxRetries: 0, timeout: 15000 });
    const r = await c.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'over tls [mock chunks=2]' }] });
    const s = await c.chat.completions.create({ model: 'gpt-4o-mini', stream: true, messages: [{ role: 'user', content: 'over tls [mock chunks=5 interval_ms=20]' }] });
    let text = '';
    for await (const ch of s) text += ch.choices?.[0]?.delta?.content ?? '';
    console.log(JSON.stringify({ usage: r.usage, text }));
  `;
  const out = await new Promise((resolve, reject) => {
    execFile(process.execPath, ['--input-type=module', '-e', script], {
      cwd: path.join(REPO, 'spec'), timeout: 30000, env: { ...process.env, NODE_EXTRA_CA_CERTS: caFile },
    }, (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout)));
  });
  const { usage, text } = JSON.parse(out.trim().split('\n').pop());
  assert.equal(usage.completion_tokens, 2);
  assert.equal(text, expected);
});

test('TLS listener refuses a client that does not trust the certificate', async () => {
  await assert.rejects(new Promise((resolve, reject) => {
    const req = https.get(`${gw.tlsUrl}/healthz`, { timeout: 5000 }, resolve);
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error('timeout')));
  }), /self.signed|certificate/i);
  // And the plain listener is unaffected.
  assert.equal((await fetchT(`${gw.url}/healthz`)).status, 200);
});

// ------------------------------------------------------------------- SIGTERM

function connectRefused(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, HOST);
    s.setTimeout(1000);
    s.on('connect', () => { s.destroy(); resolve(false); });
    s.on('timeout', () => { s.destroy(); resolve(false); });
    s.on('error', (e) => resolve(e.code === 'ECONNREFUSED'));
  });
}

test('SIGTERM: stops accepting, finishes the in-flight stream, exits 0', async () => {
  const g = await startGateway({ limits: { shutdown_timeout_ms: 5000 } }, { mock });
  const c = await openaiClient(g);
  const text = 'drain me [mock chunks=20 interval_ms=100]';
  const expected = (await mockDirect(mock, chatBody(text, { stream: true }))).content;
  const stream = await c.chat.completions.create(chatBody(text, { stream: true }));
  let content = '';
  let termAt = 0;
  let refused = null;
  let n = 0;
  for await (const chunk of stream) {
    content += chunk.choices?.[0]?.delta?.content ?? '';
    if (++n === 2) {
      termAt = Date.now();
      g.proc.signal('SIGTERM');
      // The listener closes while the stream goes on.
      refused = (async () => {
        await sleep(300);
        const r = [];
        for (let i = 0; i < 3; i++) r.push(await connectRefused(g.port));
        return r;
      })();
    }
    assert.ok(n < 500);
  }
  const streamEnd = Date.now();
  assert.ok(termAt > 0);
  assert.equal(content, expected, 'the in-flight stream completed in full');
  assert.deepEqual(await refused, [true, true, true], 'new connections refused after SIGTERM');
  const exit = await Promise.race([g.proc.exited, sleep(5000).then(() => null)]);
  assert.ok(exit, 'exited within shutdown_timeout_ms');
  assert.equal(exit.code, 0, `exit ${JSON.stringify(exit)}\n${g.proc.tail()}`);
  assert.ok(Date.now() - termAt < 5000 + 1000);
  assert.ok(Date.now() >= streamEnd - 50, 'did not exit before the stream finished');
  await g.stop();
});

test('SIGTERM: a stream longer than shutdown_timeout_ms is cut and the process exits', async () => {
  const g = await startGateway({ limits: { shutdown_timeout_ms: 1000 } }, { mock });
  const c = await openaiClient(g);
  const stream = await c.chat.completions.create(chatBody('too long [mock chunks=200 interval_ms=50]', { stream: true }));
  let termAt = 0;
  let n = 0;
  const done = (async () => {
    for await (const chunk of stream) {
      if (chunk && ++n === 2) {
        termAt = Date.now();
        g.proc.signal('SIGTERM');
      }
      assert.ok(n < 1000);
    }
  })().catch((e) => e);
  const exit = await Promise.race([
    (async () => { await waitFor(() => termAt, { timeout: 5000, what: 'stream start' }); return g.proc.exited; })(),
    sleep(8000).then(() => null),
  ]);
  assert.ok(exit, `exited after SIGTERM\n${g.proc.tail()}`);
  const took = Date.now() - termAt;
  assert.ok(took < 1000 + 2000, `exited ${took} ms after SIGTERM (shutdown_timeout_ms 1000)`);
  assert.ok(took >= 800, `waited for the stream before cutting it (${took} ms)`);
  await Promise.race([done, sleep(3000)]);
  await g.stop();
});
