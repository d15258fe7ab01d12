// Hostile bytes on the wire (raw sockets): request smuggling variants, malformed
// framing, huge request lines, headers and bodies (with and without Expect:
// 100-continue), slow senders and slow readers, pipelined mixes of good and bad
// requests, and clients that leave at every step. Each case: status (and whether the
// connection closes), error shape, access-log line, a good request after it still
// served; at the end ledger verify is clean (spec/hostile/lib.mjs).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { lit } from '../integration/lib/db.mjs';
import { waitFor } from '../integration/lib/harness.mjs';
import {
  LIMITS, MODEL, RawConn, anth, chat, finalChecks, hostileSetup, hostileTeardown, http, logLineFor, raw, rawCase,
  rawOnce, runCases, sleep,
} from './lib.mjs';

let S;
before(async () => {
  S = await hostileSetup();
});
after(() => hostileTeardown(S));

const P = '/v1/chat/completions';
const body = JSON.stringify(chat('wire [mock chunks=2]'));
const bodyLen = Buffer.byteLength(body);
const head = (lines, key = true) => (S2) => Buffer.from(`POST ${P} HTTP/1.1\r\nhost: x\r\n${key ? `authorization: Bearer ${S2.key}\r\n` : ''}content-type: application/json\r\n${lines.join('\r\n')}${lines.length ? '\r\n' : ''}\r\n`, 'latin1');
const withBody = (lines, b = body) => (S2) => Buffer.concat([head(lines)(S2), Buffer.from(b, 'latin1')]);
const chunked = (b) => `${Buffer.byteLength(b).toString(16)}\r\n${b}\r\n0\r\n\r\n`;

const refused = (extra = {}) => ({ status: 400, shape: 'openai', close: true, ...extra });

const cases = [
  // ---- smuggling and framing ----
  rawCase('smuggling: Content-Length + Transfer-Encoding', withBody([`content-length: ${bodyLen}`, 'transfer-encoding: chunked'], chunked(body)), refused()),
  rawCase('smuggling: two different Content-Lengths', withBody([`content-length: ${bodyLen}`, `content-length: ${bodyLen + 5}`]), refused()),
  rawCase('smuggling: two equal Content-Lengths', withBody([`content-length: ${bodyLen}`, `content-length: ${bodyLen}`]), refused()),
  rawCase('smuggling: Content-Length list "n, n"', withBody([`content-length: ${bodyLen}, ${bodyLen}`]), refused()),
  rawCase('smuggling: Transfer-Encoding chunked twice', withBody(['transfer-encoding: chunked', 'transfer-encoding: chunked'], chunked(body)), { status: [200, 400], shape: 'openai' }),
  rawCase('smuggling: Transfer-Encoding "chunked, identity"', withBody(['transfer-encoding: chunked, identity'], chunked(body)), { ...refused(), status: [400, 501] }),
  rawCase('smuggling: Transfer-Encoding xchunked', withBody(['transfer-encoding: xchunked'], chunked(body)), { ...refused(), status: [400, 501] }),
  // RFC 9112 5.2: a server either refuses obs-fold (400) or unfolds it; llhttp unfolds
  // a harmless header. Folded into the framing headers it must never change the framing.
  rawCase('smuggling: obs-fold in a harmless header', withBody([`content-length: ${bodyLen}`, 'x-a: 1', ' folded: yes']), { status: [200, 400], shape: 'openai' }),
  rawCase('smuggling: obs-fold in Transfer-Encoding next to Content-Length', withBody([`content-length: ${bodyLen}`, 'transfer-encoding:', ' chunked'], chunked(body)), refused()),
  rawCase('smuggling: obs-fold in Content-Length', withBody(['content-length: 1', ` ${bodyLen}`]), refused()),
  rawCase('smuggling: space before the colon', withBody([`content-length : ${bodyLen}`]), refused()),
  rawCase('framing: bad chunk size', withBody(['transfer-encoding: chunked'], `zz\r\n${body}\r\n0\r\n\r\n`), refused()),
  rawCase('framing: chunk size overflowing 64 bits', withBody(['transfer-encoding: chunked'], `fffffffffffffffffffff\r\n${body}\r\n0\r\n\r\n`), { ...refused(), status: [400, 413] }),
  rawCase('framing: negative chunk size', withBody(['transfer-encoding: chunked'], `-5\r\nhello\r\n0\r\n\r\n`), refused()),
  rawCase('framing: a chunk extension is ignored', withBody(['transfer-encoding: chunked'], `${bodyLen.toString(16)};name=value\r\n${body}\r\n0\r\n\r\n`), { status: [200, 400], shape: 'openai' }),
  rawCase('framing: a quoted chunk extension', withBody(['transfer-encoding: chunked'], `${bodyLen.toString(16)};x="a;b"\r\n${body}\r\n0\r\n\r\n`), { status: [200, 400], shape: 'openai' }),
  rawCase('framing: a 4 KB chunk extension', withBody(['transfer-encoding: chunked'], `${bodyLen.toString(16)};${'e'.repeat(4096)}\r\n${body}\r\n0\r\n\r\n`), { status: [200, 400], shape: 'openai' }),
  rawCase('framing: chunked with a trailer', withBody(['transfer-encoding: chunked'], `${bodyLen.toString(16)}\r\n${body}\r\n0\r\nx-trailer: 1\r\n\r\n`), { status: 200 }),
  rawCase('framing: LF-only line ends', (S2) => Buffer.from(`POST ${P} HTTP/1.1\nhost: x\nauthorization: Bearer ${S2.key}\ncontent-type: application/json\ncontent-length: ${bodyLen}\n\n${body}`), { status: [200, 400], shape: 'openai' }),
  rawCase('framing: bare CR in a header value', withBody([`content-length: ${bodyLen}`, 'x-a: a\rb']), refused()),
  rawCase('framing: NUL in a header value', withBody([`content-length: ${bodyLen}`, 'x-a: a\u0000b']), refused()),
  rawCase('framing: Content-Length -1', withBody(['content-length: -1']), refused()),
  rawCase('framing: Content-Length +5', withBody(['content-length: +5']), refused()),
  rawCase('framing: Content-Length 1e3', withBody(['content-length: 1e3']), refused()),
  rawCase('framing: Content-Length 2^64', withBody(['content-length: 18446744073709551616']), { ...refused(), status: [400, 413] }),
  rawCase('request line: HTTP/2 preface', Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), { ...refused(), status: [400, 505] }),
  rawCase('request line: unknown method', (S2) => Buffer.from(`BREW ${P} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${S2.key}\r\n\r\n`), { status: [400, 405, 501], shape: 'openai' }),
  rawCase('request line: NUL in the method', Buffer.from('PO\u0000ST /v1/models HTTP/1.1\r\nhost: x\r\n\r\n'), refused()),
  rawCase('request line: HTTP/9.9', Buffer.from('GET /v1/models HTTP/9.9\r\nhost: x\r\n\r\n'), { ...refused(), status: [400, 505] }),
  rawCase('request line: absolute-form target', (S2) => Buffer.from(`GET http://127.0.0.1/v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${S2.key}\r\n\r\n`), { status: [200, 400, 404], shape: 'openai' }),
  rawCase('request line: HTTP/1.0 without Host', (S2) => Buffer.from(`GET /v1/models HTTP/1.0\r\nauthorization: Bearer ${S2.key}\r\n\r\n`), { status: 200, close: true }),
  rawCase('path: dot segments to the admin API are not the admin API', (S2) => Buffer.from(`GET /v1/../admin/api/v1/tenants HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${S2.key}\r\n\r\n`), { status: [400, 401, 404], shape: 'openai' }),
  rawCase('path: %00 and %0d%0a', (S2) => Buffer.from(`GET /v1/models%00%0d%0ax-injected:%201 HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${S2.key}\r\n\r\n`), {
    status: [400, 404], shape: 'openai',
    check: (o) => assert.equal(o.res.headers['x-injected'], undefined),
  }),

  // ---- sizes ----
  rawCase('size: a 100 KB request line', (S2) => Buffer.from(`GET /v1/models?${'a'.repeat(100000)} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${S2.key}\r\n\r\n`), { status: [414, 431], shape: 'openai', close: true }),
  rawCase('size: headers over max_header_bytes', (S2) => Buffer.from(`GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${S2.key}\r\n${Array.from({ length: 200 }, (_, i) => `x-h${i}: ${'v'.repeat(60)}\r\n`).join('')}\r\n`), { status: 431, shape: 'openai', code: 'headers_too_large', close: true }),
  rawCase('size: one 20 KB header', (S2) => Buffer.from(`GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${S2.key}\r\nx-big: ${'v'.repeat(20000)}\r\n\r\n`), { status: 431, shape: 'openai', close: true }),
  rawCase('size: 10,000 tiny headers', (S2) => Buffer.from(`GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${S2.key}\r\n${'a:b\r\n'.repeat(10000)}\r\n`), { status: 431, shape: 'openai', close: true }),
  rawCase('size: declared body over max_body_bytes (no body sent)', head([`content-length: ${LIMITS.max_body_bytes + 1}`]), { status: 413, shape: 'openai', code: 'body_too_large', close: true }),
  rawCase('size: chunked body over max_body_bytes', withBody(['transfer-encoding: chunked'], `${(LIMITS.max_body_bytes + 10).toString(16)}\r\n${'x'.repeat(LIMITS.max_body_bytes + 10)}\r\n0\r\n\r\n`), { status: 413, shape: 'openai', close: true }),
  {
    name: 'size: Expect 100-continue with a body over the limit gets 413, never 100',
    status: 413, shape: 'openai',
    run: async (S2) => {
      const c = await RawConn.open(S2.gw.port);
      await c.write(head([`content-length: ${LIMITS.max_body_bytes * 4}`, 'expect: 100-continue'])(S2));
      const res = await c.response(5000);
      const closed = await c.waitClose(1500);
      c.destroy();
      return { res, closed };
    },
  },
  {
    name: 'size: Expect 100-continue with a good body gets 100 then 200',
    status: 200,
    run: async (S2) => {
      const c = await RawConn.open(S2.gw.port);
      await c.write(head([`content-length: ${bodyLen}`, 'expect: 100-continue'])(S2));
      const cont = await c.response(5000);
      assert.equal(cont?.status, 100, 'a 100 Continue before the body');
      await c.write(body);
      const res = await c.response(10000);
      c.destroy();
      return { res };
    },
  },
  {
    name: 'size: declared 10 MB body sent anyway, the 413 arrives (no reset)',
    status: 413, shape: 'openai',
    run: async (S2) => earlyRefusal(S2, head([`content-length: ${10 << 20}`])(S2), 10 << 20),
  },
  {
    name: 'auth: wrong key with a 200 KB body sent at once, the 401 arrives (no reset)',
    status: 401, shape: 'openai',
    run: async (S2) => earlyRefusal(S2, Buffer.from(`POST ${P} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer nope\r\ncontent-type: application/json\r\ncontent-length: ${200000}\r\n\r\n`), 200000),
  },

  // ---- slow senders (slowloris) ----
  {
    name: 'slowloris: headers trickled past header_timeout_ms get 408',
    status: 408, shape: 'openai', code: 'request_timeout', close: true,
    run: async (S2) => {
      const c = await RawConn.open(S2.gw.port);
      await c.write(`POST ${P} HTTP/1.1\r\nhost: x\r\n`);
      const t0 = Date.now();
      // One header byte every 200 ms: alive, but never done.
      while (!c.closed && c.buf.length === 0 && Date.now() - t0 < LIMITS.header_timeout_ms + 3000) {
        await c.write('x');
        await sleep(200);
      }
      const res = await c.response(3000);
      const closed = await c.waitClose(1500);
      c.destroy();
      return { res, closed };
    },
  },
  {
    name: 'slowloris: body trickled past body_timeout_ms gets 408',
    status: 408, shape: 'openai', code: 'request_timeout', close: true,
    run: async (S2) => {
      const c = await RawConn.open(S2.gw.port);
      await c.write(head([`content-length: ${bodyLen}`])(S2));
      const t0 = Date.now();
      let i = 0;
      while (!c.closed && c.buf.length === 0 && i < bodyLen - 1 && Date.now() - t0 < LIMITS.body_timeout_ms + 3000) {
        await c.write(body[i++]);
        await sleep(150);
      }
      const res = await c.response(3000);
      const closed = await c.waitClose(1500);
      c.destroy();
      return { res, closed };
    },
  },
  {
    name: 'slowloris: a connection that sends nothing is closed',
    status: null, log: false,
    run: async (S2) => {
      const c = await RawConn.open(S2.gw.port);
      const closed = await c.waitClose(LIMITS.header_timeout_ms + LIMITS.idle_timeout_ms + 2000);
      assert.ok(closed, 'an idle connection is closed by the gateway');
      const res = c.buf.length ? await c.response(100) : null;
      c.destroy();
      return { res: res && res.status === 408 ? null : res };
    },
  },

  // ---- slow readers ----
  {
    name: 'slow reader: a stream read 1 KB at a time completes',
    status: 200,
    run: async (S2) => slowRead(S2, { ...chat('[mock chunks=400]'), stream: true, max_tokens: 1000 }, 300),
  },
  {
    name: 'slow reader: a 1 MB non-stream answer to a paused, then rate-limited reader completes',
    status: 200,
    run: async (S2) => {
      const o = await slowRead(S2, { ...chat('[mock chunks=100000]'), max_tokens: 200000 }, 1000);
      assert.equal(o.res?.json?.usage?.completion_tokens, 100000, 'the whole answer arrived');
      return o;
    },
  },

  // ---- pipelining ----
  {
    name: 'pipelining: good, malformed, good on one connection',
    status: 200,
    run: async (S2) => {
      const good = withBody([`content-length: ${bodyLen}`])(S2);
      const badReq = Buffer.from(`POST ${P} HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n`);
      const c = await RawConn.open(S2.gw.port);
      await c.write(Buffer.concat([good, badReq, good]));
      const r1 = await c.response(10000);
      const r2 = await c.response(10000);
      const r3 = await c.response(2000);
      const closed = await c.waitClose(2000);
      c.destroy();
      assert.equal(r2?.status, 400, 'the malformed one gets 400');
      assert.equal(r3, null, 'nothing after the malformed one is answered');
      assert.ok(closed, 'the connection closes after the 400');
      return { res: r1 };
    },
  },
  {
    name: 'pipelining: chat, stream, messages, models, bad JSON, chat on one connection',
    status: 200,
    run: async (S2) => {
      const k = { authorization: `Bearer ${S2.key}` };
      const reqs = [
        raw('POST', P, { headers: k, body: chat('p1 [mock chunks=2]') }),
        raw('POST', P, { headers: k, body: { ...chat('p2 [mock chunks=3]'), stream: true } }),
        raw('POST', '/v1/messages', { headers: { 'x-api-key': S2.key }, body: anth('p3 [mock chunks=2]') }),
        raw('GET', '/v1/models', { headers: k }),
        raw('POST', P, { headers: k, body: '{"model":' }),
        raw('POST', P, { headers: k, body: chat('p6 [mock chunks=1]') }),
      ];
      const c = await RawConn.open(S2.gw.port);
      await c.write(Buffer.concat(reqs));
      const got = [];
      for (let i = 0; i < reqs.length; i++) got.push(await c.response(10000));
      c.destroy();
      assert.deepEqual(got.map((r) => r?.status), [200, 200, 200, 200, 400, 200], 'in order, each its own answer');
      assert.equal(got[2].json.type, 'message');
      assert.equal(got[4].json.error.code, 'invalid_json');
      for (const r of got) assert.ok(await logLineFor(S2.gw, r.headers['x-request-id']), 'each has its access-log line');
      return { res: got[5] };
    },
  },
  {
    name: 'pipelining: 50 requests in one write',
    status: 200,
    run: async (S2) => {
      const one = raw('POST', P, { headers: { authorization: `Bearer ${S2.key}` }, body: chat('pp [mock chunks=1]') });
      const c = await RawConn.open(S2.gw.port);
      await c.write(Buffer.concat(Array.from({ length: 50 }, () => one)));
      let last;
      for (let i = 0; i < 50; i++) {
        last = await c.response(10000);
        assert.equal(last?.status, 200, `pipelined #${i}`);
      }
      c.destroy();
      return { res: last };
    },
  },

  // ---- HEAD ----
  {
    name: 'HEAD (with a request body) then GET on one connection: a head only, then the GET',
    status: 200,
    run: async (S2) => {
      const c = await RawConn.open(S2.gw.port);
      const k = `authorization: Bearer ${S2.key}\r\n`;
      const smuggled = `GET /v1/models HTTP/1.1\r\nhost: x\r\n${k}x-smuggled: 1\r\n\r\n`;
      await c.write(`HEAD /v1/models HTTP/1.1\r\nhost: x\r\n${k}content-length: ${smuggled.length}\r\n\r\n${smuggled}` +
        `GET /v1/models HTTP/1.1\r\nhost: x\r\n${k}\r\n`);
      // A HEAD answer is a head only: read it, then the next bytes must be a new response.
      await c.until(() => c.buf.indexOf('\r\n\r\n') >= 0, 5000);
      const end = c.buf.indexOf('\r\n\r\n');
      const headText = c.buf.subarray(0, end).toString('latin1');
      assert.match(headText, /^HTTP\/1\.1 200/, 'the HEAD is answered 200');
      c.buf = c.buf.subarray(end + 4);
      await c.until(() => c.buf.length >= 12, 5000);
      assert.match(c.buf.subarray(0, 12).toString('latin1'), /^HTTP\/1\.1 \d{3}/, `a body after the HEAD's head: ${c.buf.subarray(0, 80).toString()}`);
      const res = await c.response(5000);
      assert.ok(Array.isArray(res?.json?.data), 'the GET gets the model list');
      const more = await c.response(1000);
      c.destroy();
      assert.equal(more, null, 'the body of the HEAD was not answered as a request');
      return { res };
    },
  },

  // ---- clients that leave ----
  {
    name: 'disconnect: mid-headers',
    status: null, log: false,
    run: async (S2) => leaveAfter(S2, head([`content-length: ${bodyLen}`])(S2).subarray(0, 30)),
  },
  {
    name: 'disconnect: mid-body',
    status: null, log: false,
    run: async (S2) => leaveAfter(S2, withBody([`content-length: ${bodyLen}`])(S2).subarray(0, -10)),
  },
  {
    name: 'disconnect: after the request, while the upstream has not answered',
    status: null, log: false,
    run: async (S2) => {
      const before_ = (await S2.mock.stats()).aborted;
      await leaveAfter(S2, raw('POST', P, { headers: { authorization: `Bearer ${S2.key}` }, body: chat('[mock delay_ms=2000]') }), 300);
      await waitFor(async () => (await S2.mock.stats()).aborted > before_, { timeout: 3000, what: 'the upstream call to be aborted' });
      return { res: null };
    },
  },
  {
    name: 'disconnect: mid-stream is logged 499 and billed as estimated',
    status: 200,
    run: async (S2) => {
      const c = await RawConn.open(S2.gw.port);
      await c.write(raw('POST', P, { headers: { authorization: `Bearer ${S2.key}` }, body: { ...chat('[mock chunks=50 interval_ms=40 usage=0]'), stream: true, max_tokens: 100 } }));
      await c.until(() => (c.buf.toString().match(/"content"/g) || []).length >= 3, 5000);
      const headText = c.buf.toString('latin1');
      c.destroy();
      const rid = /x-request-id: (\S+)/i.exec(headText)?.[1];
      assert.ok(rid);
      const line = await logLineFor(S2.gw, rid, 5000);
      assert.equal(line?.status, 499, 'a client that left mid-stream is logged 499');
      await waitFor(async () => (await S2.db.scalar(`SELECT count(*) FROM usage WHERE request_id = ${lit(rid)}`)) === '1', { timeout: 8000, what: 'its usage row' });
      assert.equal(await S2.db.scalar(`SELECT estimated FROM usage WHERE request_id = ${lit(rid)}`), 't', 'billed as estimated');
      return { res: { status: 200, headers: {} }, requestId: rid, skipLog: true };
    },
    log: false,
  },
  {
    name: 'disconnect: half-close after the request still gets the answer or a clean close',
    status: [200, null],
    run: async (S2) => {
      const c = await RawConn.open(S2.gw.port);
      await c.write(withBody([`content-length: ${bodyLen}`])(S2));
      c.sock.end();
      const res = await c.response(8000);
      c.destroy();
      return { res };
    },
  },
  {
    name: 'disconnect: 200 connections opened and dropped at once',
    status: null, log: false,
    run: async (S2) => {
      const conns = await Promise.all(Array.from({ length: 200 }, () => RawConn.open(S2.gw.port)));
      await Promise.all(conns.map((c, i) => c.write(withBody([`content-length: ${bodyLen}`])(S2).subarray(0, i % 120))));
      for (const c of conns) c.sock.resetAndDestroy ? c.sock.resetAndDestroy() : c.destroy();
      return { res: null };
    },
  },
  // The server's own answers (parser 400, 408, 413, 431) on /v1/messages are Anthropic's.
  rawCase('messages: Content-Length + Transfer-Encoding is an Anthropic 400', (S2) => Buffer.from(`POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: ${S2.key}\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n`), { status: 400, shape: 'anthropic', close: true }),
  rawCase('messages: a declared body over the limit is an Anthropic 413', (S2) => Buffer.from(`POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: ${S2.key}\r\ncontent-length: ${LIMITS.max_body_bytes + 1}\r\n\r\n`), { status: 413, shape: 'anthropic', close: true }),
  rawCase('messages: headers over the limit are an Anthropic 431', (S2) => Buffer.from(`POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: ${S2.key}\r\nx-big: ${'v'.repeat(20000)}\r\n\r\n`), { status: 431, shape: 'anthropic', close: true }),
  {
    name: 'messages: a body trickled past body_timeout_ms is an Anthropic 408',
    status: 408, shape: 'anthropic', close: true,
    run: async (S2) => {
      const b = JSON.stringify(anth('slow'));
      const c = await RawConn.open(S2.gw.port);
      await c.write(`POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: ${S2.key}\r\ncontent-type: application/json\r\ncontent-length: ${b.length}\r\n\r\n${b.slice(0, 5)}`);
      const res = await c.response(LIMITS.body_timeout_ms + 3000);
      const closed = await c.waitClose(1500);
      c.destroy();
      return { res, closed };
    },
  },
  rawCase('messages: wrong key on a raw socket is Anthropic-shaped', () => raw('POST', '/v1/messages', { headers: { 'x-api-key': 'nope' }, body: anth() }), { status: 401, shape: 'anthropic' }),
  rawCase('messages: bad JSON on a raw socket is Anthropic-shaped', (S2) => raw('POST', '/v1/messages', { headers: { 'x-api-key': S2.key }, body: '{"model":' }), { status: 400, shape: 'anthropic' }),
];

/** Sends a head that declares `total` body bytes and then the body in 64 KB writes. */
async function earlyRefusal(S2, headBytes, total) {
  const c = await RawConn.open(S2.gw.port);
  await c.write(headBytes);
  const chunk = Buffer.alloc(65536, 0x61);
  for (let sent = 0; sent < total && !c.closed; sent += chunk.length) {
    c.sock.write(chunk);
    if (sent % (1 << 20) === 0) await sleep(1);
  }
  const res = await c.response(5000);
  c.destroy();
  return { res, closed: true, error: c.error };
}

/** Writes bytes, waits `ms`, leaves (RST). */
async function leaveAfter(S2, bytes, ms = 50) {
  const c = await RawConn.open(S2.gw.port);
  await c.write(bytes);
  await sleep(ms);
  if (c.sock.resetAndDestroy) c.sock.resetAndDestroy();
  else c.destroy();
  return { res: null };
}

/**
 * A request whose answer is not read for `pauseMs`, then read at about `rate` bytes a
 * second (what `curl --limit-rate` does) until one whole response has arrived.
 */
async function slowRead(S2, reqBody, pauseMs, rate = 4 << 20) {
  const c = await RawConn.open(S2.gw.port);
  c.sock.pause();
  await c.write(raw('POST', P, { headers: { authorization: `Bearer ${S2.key}` }, body: reqBody }));
  await sleep(pauseMs);
  let windowStart = Date.now();
  let windowBytes = 0;
  c.sock.on('data', (d) => {
    windowBytes += d.length;
    if (windowBytes >= rate / 100) {
      c.sock.pause();
      const wait = Math.max(0, 10 - (Date.now() - windowStart));
      setTimeout(() => {
        windowStart = Date.now();
        windowBytes = 0;
        c.sock.resume();
      }, wait);
    }
  });
  c.sock.resume();
  const res = await c.response(30000);
  c.destroy();
  if (res) assert.ok(res.body.length > 0);
  return { res };
}

runCases(() => S, cases);

test('the end: ledger verify is clean, tables intact, gateway up', async () => {
  await finalChecks(S);
});

void MODEL;
void http;
void rawOnce;
