// OpenTelemetry traces (#21, item 5): a small OTLP/HTTP JSON receiver on 127.0.0.1
// stands in for the collector; the gateway runs the whole pipeline (accounts from
// Postgres, admission and money in Redis, billing) against the mock upstream.
//
//   group `pool`: account `hi` (priority 1, made to fail once when a test asks) and
//                 `lo` (priority 0): a retry goes from hi to lo, deterministically
//
// What a user of the traces would check: the spans of one request arrive, parented as
// a tree under the server span; the client's trace id is kept and its tracestate
// passed; the upstream got a traceparent of the same trace whose parent is the
// attempt's span; ratio 0 sends nothing (but a client's sampled flag is followed);
// hostile traceparents start a new trace; a dead or hanging collector never slows or
// fails a request, and what could not be sent is counted in /metrics.

import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { after, before, test } from 'node:test';

import { freePort, parseMetrics, sleep, waitFor } from './lib/harness.mjs';
import { startRouting } from './lib/routing.mjs';

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const PARENT = '00f067aa0ba902b7';
let rt;
let receiver;
let ids; // account name -> id
const got = []; // every span received: {service, span}

/** The OTLP receiver: POST /v1/traces bodies, spans flattened with their service. */
async function startReceiver() {
  const srv = http.createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (d) => {
      body += d;
    });
    req.on('end', () => {
      let ok = req.method === 'POST' && req.url === '/v1/traces' && /application\/json/.test(req.headers['content-type']);
      try {
        const doc = JSON.parse(body);
        for (const rs of doc.resourceSpans) {
          const service = rs.resource.attributes.find((a) => a.key === 'service.name')?.value.stringValue;
          for (const ss of rs.scopeSpans) for (const span of ss.spans) got.push({ service, span, auth: req.headers['x-collector-key'] });
        }
      } catch {
        ok = false;
      }
      res.writeHead(ok ? 200 : 400, { 'content-type': 'application/json' });
      res.end('{}');
    });
  });
  srv.listen(0, '127.0.0.1');
  await new Promise((r) => srv.once('listening', r));
  return { srv, url: `http://127.0.0.1:${srv.address().port}/v1/traces` };
}

/** A metric's value from /metrics text: name and, optionally, one label's value. */
async function metric(gw, name, label) {
  const all = parseMetrics(await (await fetch(`${gw.url}/metrics`)).text());
  const m = all.find((x) => x.name === name && (!label || Object.entries(label).every(([k, v]) => x.labels[k] === v)));
  return m ? m.value : undefined;
}

const attr = (span, key) => {
  const v = span.attributes.find((a) => a.key === key)?.value;
  return v === undefined ? undefined : v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : v.boolValue);
};

/** The server span of the request whose x-request-id is `id`, and the headers its POST had. */
async function spansOf(id, service = 'tg-traces') {
  const server = await waitFor(() => got.find((g) => g.service === service && g.span.kind === 2 && attr(g.span, 'tollgate.request.id') === id), {
    timeout: 5000,
    what: `the server span of request ${id}`,
  });
  const s = server.span;
  return { server: s, auth: server.auth };
}

const tracing = (extra = {}) => ({
  endpoint: receiver.url,
  sample_ratio: 1,
  batch_size: 64,
  batch_interval_ms: 50,
  service_name: 'tg-traces',
  headers: { 'x-collector-key': 'k-123' },
  ...extra,
});

before(async () => {
  receiver = await startReceiver();
  rt = await startRouting({
    accounts: [
      { name: 'hi', priority: 1 },
      { name: 'lo', priority: 0 },
    ],
    routing: { max_attempts: 3, cooldown_5xx_ms: 60000 },
    gateway: { tracing: tracing() },
  });
  const rows = await rt.db.query("SELECT name, id FROM accounts WHERE name IN ('hi', 'lo')");
  ids = Object.fromEntries(rows.map((r) => [r.name, Number(r.id)]));
});

after(async () => {
  await rt?.stop();
  receiver?.srv.close();
});

test('a request continues the client trace: a server span with its children, and the upstream joins it', async () => {
  const res = await rt.chat('traced [mock chunks=3]', {}, {
    headers: { traceparent: `00-${TRACE}-${PARENT}-01`, tracestate: 'vendor=abc,other=x' },
  });
  assert.equal(res.status, 200);
  const id = res.headers['x-request-id'];
  const { server, auth } = await spansOf(id);
  assert.equal(server.traceId, TRACE, 'the client trace id is kept');
  assert.equal(server.parentSpanId, PARENT, 'the server span is a child of the client span');
  assert.equal(server.traceState, 'vendor=abc,other=x');
  assert.equal(auth, 'k-123', 'the configured headers reach the collector');
  assert.equal(attr(server, 'http.response.status_code'), 200);
  assert.equal(attr(server, 'gen_ai.request.model'), 'gpt-4o-mini');
  assert.equal(attr(server, 'gen_ai.operation.name'), 'chat');
  assert.equal(attr(server, 'gen_ai.usage.output_tokens'), 3);
  assert.ok(attr(server, 'gen_ai.usage.input_tokens') >= 1);
  await waitFor(() => got.filter((g) => g.span.parentSpanId === server.spanId).length >= 4, { what: 'four child spans' });
  const kids = got.filter((g) => g.span.parentSpanId === server.spanId).map((g) => g.span);
  const byName = Object.fromEntries(kids.map((k) => [k.name, k]));
  assert.deepEqual(Object.keys(byName).sort(), ['admission', 'chat gpt-4o-mini', 'select account', 'settlement'], JSON.stringify(kids.map((k) => k.name)));
  for (const k of kids) {
    assert.equal(k.traceId, TRACE);
    assert.ok(BigInt(k.startTimeUnixNano) >= BigInt(server.startTimeUnixNano), `${k.name} starts within the request`);
    assert.ok(BigInt(k.endTimeUnixNano) <= BigInt(server.endTimeUnixNano), `${k.name} ends within the request`);
    assert.notEqual(k.spanId, server.spanId);
  }
  assert.equal(attr(byName.admission, 'tollgate.admission.result'), 'admitted');
  const call = byName['chat gpt-4o-mini'];
  assert.equal(call.kind, 3, 'the upstream attempt is a CLIENT span');
  assert.equal(attr(call, 'http.response.status_code'), 200);
  assert.equal(attr(call, 'gen_ai.provider.name'), 'openai');
  assert.equal(attr(call, 'tollgate.account.id'), ids.hi);
  assert.equal(attr(byName['select account'], 'tollgate.account.id'), ids.hi);
  assert.equal(attr(byName.settlement, 'tollgate.settlement.kind'), 'settled');
  assert.equal(attr(byName.settlement, 'tollgate.request.id'), id);
  // The upstream saw the same trace, with the attempt's span as its parent.
  const last = await rt.mock.last();
  assert.equal(last.headers.traceparent, `00-${TRACE}-${call.spanId}-01`);
  assert.equal(last.headers.tracestate, 'vendor=abc,other=x');
});

test('each upstream attempt is a span: status, account and retry number', async () => {
  await rt.fault('hi', { status: 500, count: 1 });
  const res = await rt.chat('retried [mock chunks=2]');
  assert.equal(res.status, 200);
  const { server } = await spansOf(res.headers['x-request-id']);
  assert.equal(server.parentSpanId ?? '', '', 'no client trace: the server span is a root');
  await waitFor(() => got.filter((g) => g.span.parentSpanId === server.spanId && g.span.kind === 3).length === 2, { what: 'two attempt spans' });
  const calls = got.filter((g) => g.span.parentSpanId === server.spanId && g.span.kind === 3).map((g) => g.span)
    .sort((a, b) => attr(a, 'tollgate.attempt') - attr(b, 'tollgate.attempt'));
  assert.equal(attr(calls[0], 'tollgate.attempt'), 1);
  assert.equal(attr(calls[0], 'http.response.status_code'), 500);
  assert.equal(attr(calls[0], 'tollgate.account.id'), ids.hi);
  assert.equal(attr(calls[0], 'error.type'), '500');
  assert.equal(calls[0].status?.code, 2, 'a failed attempt has status ERROR');
  assert.equal(attr(calls[0], 'http.request.resend_count'), undefined);
  assert.equal(attr(calls[1], 'tollgate.attempt'), 2);
  assert.equal(attr(calls[1], 'http.request.resend_count'), 1);
  assert.equal(attr(calls[1], 'http.response.status_code'), 200);
  assert.equal(attr(calls[1], 'tollgate.account.id'), ids.lo);
  assert.ok(BigInt(calls[1].startTimeUnixNano) >= BigInt(calls[0].endTimeUnixNano), 'the retry starts after the failure');
  assert.equal(attr(server, 'tollgate.attempts'), 2);
  const selects = got.filter((g) => g.span.parentSpanId === server.spanId && g.span.name === 'select account');
  assert.equal(selects.length, 2, 'an account selection per attempt');
  // The upstream's traceparent names the second attempt's span (the last request it got).
  const last = await rt.mock.last();
  assert.equal(last.headers.traceparent, `00-${server.traceId}-${calls[1].spanId}-01`);
});

test('hostile traceparent values are ignored: a new trace, the request served', async () => {
  const hostile = [
    'garbage',
    `00-${TRACE.toUpperCase()}-${PARENT}-01`,
    `00-${'0'.repeat(32)}-${PARENT}-01`,
    `00-${TRACE}-${'0'.repeat(16)}-01`,
    `ff-${TRACE}-${PARENT}-01`,
    `00-${TRACE}-${PARENT}-01-extra`,
    `00-${TRACE}-${PARENT}-01${'a'.repeat(4000)}`,
    `01-${TRACE}-${PARENT}-01${'x'.repeat(600)}`,
    `00_${TRACE}_${PARENT}_01`,
    `00-${TRACE}-${PARENT}-0g`,
  ];
  for (const tp of hostile) {
    const res = await rt.chat('hostile [mock chunks=1]', {}, { headers: { traceparent: tp, tracestate: `a=${'b'.repeat(600)}` } });
    assert.equal(res.status, 200, tp.slice(0, 80));
    const { server } = await spansOf(res.headers['x-request-id']);
    assert.notEqual(server.traceId, TRACE, `a new trace for ${tp.slice(0, 60)}`);
    assert.match(server.traceId, /^[0-9a-f]{32}$/);
    assert.notEqual(server.traceId, '0'.repeat(32));
    assert.equal(server.parentSpanId ?? '', '');
    assert.equal(server.traceState ?? '', '', 'an oversized tracestate is not passed');
    const last = await rt.mock.last();
    assert.match(last.headers.traceparent, new RegExp(`^00-${server.traceId}-[0-9a-f]{16}-01$`), 'the upstream joins the new trace');
    assert.equal(last.headers.tracestate, undefined);
  }
  // A valid traceparent is continued, but an oversized tracestate is not passed on.
  const res = await rt.chat('big state [mock chunks=1]', {}, {
    headers: { traceparent: `00-${TRACE.replace(/^4/, '7')}-${PARENT}-01`, tracestate: `a=${'b'.repeat(600)}` },
  });
  const { server } = await spansOf(res.headers['x-request-id']);
  assert.equal(server.traceId, TRACE.replace(/^4/, '7'));
  assert.equal(server.traceState ?? '', '');
  assert.equal((await rt.mock.last()).headers.tracestate, undefined);
});

test('sample ratio 0 sends nothing for new traces, but follows a client that sampled', async () => {
  const g = await rt.another({ tracing: tracing({ sample_ratio: 0, service_name: 'tg-ratio0' }) });
  const ids = [];
  for (let i = 0; i < 5; i++) {
    const res = await rt.chat('unsampled [mock chunks=1]', {}, { gw: g });
    assert.equal(res.status, 200);
    ids.push(res.headers['x-request-id']);
    const last = await rt.mock.last();
    assert.match(last.headers.traceparent, /^00-[0-9a-f]{32}-[0-9a-f]{16}-00$/, 'the upstream gets the trace, not sampled');
  }
  // A client's unsampled flag is followed too (on the ratio-1 gateway).
  const un = await rt.chat('client unsampled [mock chunks=1]', {}, { headers: { traceparent: `00-${TRACE.replace(/^4/, '5')}-${PARENT}-00` } });
  assert.equal(un.status, 200);
  assert.equal((await rt.mock.last()).headers.traceparent, `00-${TRACE.replace(/^4/, '5')}-${PARENT}-00`, 'passed on as it came');
  // Parent-based: a sampled client is traced even at ratio 0.
  const tp = `00-${TRACE.replace(/^4/, '6')}-${PARENT}-01`;
  const res = await rt.chat('client sampled [mock chunks=1]', {}, { gw: g, headers: { traceparent: tp } });
  const { server } = await spansOf(res.headers['x-request-id'], 'tg-ratio0');
  assert.equal(server.traceId, TRACE.replace(/^4/, '6'));
  await sleep(300); // several batch intervals
  assert.equal(got.filter((g2) => ids.includes(attr(g2.span, 'tollgate.request.id'))).length, 0, 'no span of an unsampled request');
  assert.equal(got.filter((g2) => g2.span.traceId === TRACE.replace(/^4/, '5')).length, 0);
  assert.equal(await metric(g, 'tollgate_trace_sampled_total'), 1);
});

test('a hanging or dead collector never slows or fails a request; what is lost is counted', async () => {
  // A collector that accepts and never answers: the exporter waits its timeout, the
  // pool of 4 records fills, later sampled requests are served untraced and counted.
  const hang = net.createServer(() => {});
  hang.listen(0, '127.0.0.1');
  await new Promise((r) => hang.once('listening', r));
  const held = [];
  hang.on('connection', (s) => held.push(s));
  const g = await rt.another({
    tracing: tracing({ endpoint: `http://127.0.0.1:${hang.address().port}/v1/traces`, queue_size: 4, batch_size: 2, timeout_ms: 8000 }),
  });
  const t0 = Date.now();
  const rs = await Promise.all(Array.from({ length: 12 }, () => rt.chat('collector hangs [mock chunks=1]', {}, { gw: g })));
  const took = Date.now() - t0;
  assert.deepEqual(rs.map((r) => r.status), Array(12).fill(200));
  // Had a worker waited on the collector, a request would take its 8 s timeout.
  assert.ok(took < 5000, `12 requests took ${took} ms with the collector hanging`);
  const full = await metric(g, 'tollgate_trace_dropped_total', { reason: 'queue_full' });
  assert.ok(full >= 1, `dropped (queue full): ${full}`);
  // A collector that is not there at all: connection refused, counted as failed exports.
  const dead = await freePort();
  const d = await rt.another({ tracing: tracing({ endpoint: `http://127.0.0.1:${dead}/v1/traces` }) });
  for (let i = 0; i < 3; i++) assert.equal((await rt.chat('collector dead [mock chunks=1]', {}, { gw: d })).status, 200);
  await waitFor(async () => (await metric(d, 'tollgate_trace_dropped_total', { reason: 'export_failed' })) >= 3 &&
    (await metric(d, 'tollgate_trace_exports_total', { result: 'failed' })) >= 1, { what: 'the failed exports counted' });
  for (const s of held) s.destroy();
  hang.close();
});
