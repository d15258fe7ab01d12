// Every error a client can meet, with its exact status and stable OpenAI-shaped code,
// and hostile bytes on a raw socket. What is checked is what a client sees: status,
// JSON body, content-type, x-request-id, whether the connection closes, and that bad
// requests never cost an upstream call. The gateway must stay up through all of it.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  CLIENT_KEY, MODEL, RawConn, chatBody, fetchT, freePort, mockDirect, openaiClient, postJson, rawRequest, sleep,
  startGateway, startMock, stopAll,
} from './lib/harness.mjs';

const MAX_BODY = 65536;
const BODY_TIMEOUT = 1500;
const FIRST_BYTE_TIMEOUT = 1000;

let mock;
let gw;
let client;

before(async () => {
  mock = await startMock();
  gw = await startGateway({
    upstream: { first_byte_timeout_ms: FIRST_BYTE_TIMEOUT },
    limits: { max_body_bytes: MAX_BODY, body_timeout_ms: BODY_TIMEOUT },
  }, { mock });
  client = await openaiClient(gw);
});

after(stopAll);

/** Asserts an OpenAI-shaped error response with this status and code. */
function expectError(res, status, code, what = '') {
  const ctx = `${what} → ${res.status} ${res.text ?? ''}`.slice(0, 400);
  assert.equal(res.status, status, ctx);
  const get = (h) => (typeof res.headers.get === 'function' ? res.headers.get(h) : res.headers[h]);
  assert.match(get('content-type') ?? '', /^application\/json/, `content-type: ${ctx}`);
  assert.ok(get('x-request-id'), `x-request-id present: ${ctx}`);
  assert.ok(res.json && typeof res.json.error === 'object', `OpenAI error shape: ${ctx}`);
  assert.equal(typeof res.json.error.message, 'string', ctx);
  assert.ok(res.json.error.message.length > 0, ctx);
  assert.equal(typeof res.json.error.type, 'string', ctx);
  if (Array.isArray(code)) assert.ok(code.includes(res.json.error.code), `code one of ${code}: ${ctx}`);
  else if (code !== undefined) assert.equal(res.json.error.code, code, ctx);
  else assert.equal(typeof res.json.error.code, 'string', ctx);
}

/** Runs fn and asserts the upstream got no request meanwhile. */
async function noUpstreamCall(fn) {
  const before_ = (await mock.stats()).total;
  const r = await fn();
  await sleep(20);
  assert.equal((await mock.stats()).total, before_, 'the bad request never reached the upstream');
  return r;
}

/** One raw request on a fresh connection: its response (or null) and whether it closed. */
async function rawOnce(bytes, { timeout = 5000, closeWait = 0 } = {}) {
  const c = await RawConn.open(gw.port);
  await c.write(bytes);
  const res = await c.response(timeout);
  const closed = closeWait ? await c.waitClose(closeWait) : c.closed;
  c.destroy();
  return { res, closed, conn: c };
}

async function normalRequestWorks() {
  for (let i = 0; i < 4; i++) {
    const res = await postJson(gw.url, '/v1/chat/completions', chatBody(`still fine ${i} [mock chunks=2]`), { headers: { connection: 'close' } });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.json.usage.completion_tokens, 2);
  }
}

test('401 invalid_api_key: missing, wrong, empty, non-Bearer key', async () => {
  await noUpstreamCall(async () => {
    const body = chatBody('hi');
    expectError(await postJson(gw.url, '/v1/chat/completions', body, { key: null }), 401, 'invalid_api_key', 'no key');
    expectError(await postJson(gw.url, '/v1/chat/completions', body, { key: 'tg-wrong-key' }), 401, 'invalid_api_key', 'wrong key');
    expectError(await postJson(gw.url, '/v1/chat/completions', body, { key: '' }), 401, 'invalid_api_key', 'empty key');
    expectError(await postJson(gw.url, '/v1/chat/completions', body, { key: null, headers: { authorization: `Basic ${CLIENT_KEY}` } }),
      401, 'invalid_api_key', 'Basic scheme');
    expectError(await postJson(gw.url, '/v1/chat/completions', body, { key: `${CLIENT_KEY}x` }), 401, 'invalid_api_key', 'key prefix');
    const r = await fetchT(`${gw.url}/v1/models`);
    expectError({ status: r.status, headers: r.headers, json: await r.json() }, 401, 'invalid_api_key', 'models without key');
  });
});

test('401 for a key one byte away from a key in use (the same slot of the workers\' key digests: same length, same last 8 bytes), and for a long one', async () => {
  // Each worker keeps the SHA-256 of keys it saw lately; the bytes must match in full.
  for (let i = 0; i < 2; i++) await normalRequestWorks();
  const near = (i) => CLIENT_KEY.slice(0, i) + (CLIENT_KEY[i] === 'x' ? 'y' : 'x') + CLIENT_KEY.slice(i + 1);
  await noUpstreamCall(async () => {
    for (let i = 0; i < CLIENT_KEY.length - 8; i++) {
      for (let k = 0; k < 3; k++) {
        expectError(await postJson(gw.url, '/v1/chat/completions', chatBody('hi'), { key: near(i), headers: { connection: 'close' } }),
          401, 'invalid_api_key', `byte ${i} changed`);
      }
    }
    expectError(await postJson(gw.url, '/v1/chat/completions', chatBody('hi'), { key: CLIENT_KEY + 'k'.repeat(200) }),
      401, 'invalid_api_key', 'a 211-byte key');
  });
  await normalRequestWorks();
});

test('401 through the SDK is an AuthenticationError', async () => {
  const bad = await openaiClient(gw, { apiKey: 'tg-nope' });
  await assert.rejects(bad.chat.completions.create(chatBody('hi')), (e) => {
    assert.equal(e.status, 401);
    assert.equal(e.code, 'invalid_api_key');
    assert.equal(e.constructor.name, 'AuthenticationError');
    return true;
  });
});

test('400 invalid_json for malformed JSON', async () => {
  await noUpstreamCall(async () => {
    expectError(await postJson(gw.url, '/v1/chat/completions', '{"model":"gpt-4o-mini","messages":['), 400, 'invalid_json', 'truncated');
    expectError(await postJson(gw.url, '/v1/chat/completions', 'not json at all'), 400, 'invalid_json', 'text');
    expectError(await postJson(gw.url, '/v1/chat/completions', ''), 400, 'invalid_json', 'empty body');
  });
});

test('400 missing_model', async () => {
  await noUpstreamCall(async () => {
    expectError(await postJson(gw.url, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }] }), 400, 'missing_model');
    expectError(await postJson(gw.url, '/v1/chat/completions', { model: '', messages: [{ role: 'user', content: 'hi' }] }), 400, ['missing_model', 'invalid_model'], 'empty model');
  });
});

test('404 not_found for unknown routes, 405 method_not_allowed for a wrong method', async () => {
  await noUpstreamCall(async () => {
    for (const p of ['/v1/nope', '/v2/chat/completions', '/v1/chat/completions/extra']) {
      const r = await fetchT(gw.url + p, { method: 'POST', headers: { authorization: `Bearer ${CLIENT_KEY}` }, body: '{}' });
      expectError({ status: r.status, headers: r.headers, json: await r.json() }, 404, 'not_found', p);
    }
    const r = await fetchT(`${gw.url}/v1/chat/completions`, { headers: { authorization: `Bearer ${CLIENT_KEY}` } });
    expectError({ status: r.status, headers: r.headers, json: await r.json() }, 405, 'method_not_allowed');
  });
});

test('413 body_too_large: declared Content-Length is refused before the body is sent', async () => {
  await noUpstreamCall(async () => {
    for (const cl of [String(MAX_BODY + 1), '2000000', '10000000000']) {
      const c = await RawConn.open(gw.port);
      const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${cl}\r\n\r\n`;
      const t0 = Date.now();
      await c.write(head);
      const res = await c.response(3000);
      c.destroy();
      assert.ok(res, `a response without sending the body (Content-Length ${cl})`);
      expectError(res, 413, 'body_too_large', `Content-Length ${cl}`);
      assert.ok(Date.now() - t0 < BODY_TIMEOUT, 'answered at once, not after the body timeout');
    }
  });
});

test('413 body_too_large: a chunked body that grows past the limit', async () => {
  await noUpstreamCall(async () => {
    const c = await RawConn.open(gw.port);
    await c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
      'Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n');
    const piece = `{"model":"${MODEL}","x":"${'a'.repeat(16000)}`;
    // At most ~2x the limit; stop as soon as the gateway answers.
    for (let sent = 0; sent < 2 * MAX_BODY && !c.closed && c.buf.length === 0; sent += piece.length) {
      await c.write(`${piece.length.toString(16)}\r\n${piece}\r\n`);
      await sleep(5);
    }
    const res = await c.response(3000);
    c.destroy();
    assert.ok(res, 'a response');
    expectError(res, 413, 'body_too_large', 'chunked');
  });
});

test('a body of exactly max_body_bytes is accepted', async () => {
  const base = JSON.stringify(chatBody('exact size [mock chunks=1]'));
  const body = base.slice(0, -1) + ' '.repeat(MAX_BODY - base.length) + '}';
  assert.equal(Buffer.byteLength(body), MAX_BODY);
  const res = await postJson(gw.url, '/v1/chat/completions', body);
  assert.equal(res.status, 200, res.text.slice(0, 300));
  const big = await postJson(gw.url, '/v1/chat/completions', body.slice(0, -1) + ' }').catch((e) => e);
  if (!(big instanceof Error)) expectError(big, 413, 'body_too_large', 'one byte over');
});

test('502 upstream_unreachable when the upstream port is closed', async () => {
  const deadPort = await freePort();
  const dead = await startGateway({ upstream: { url: `http://127.0.0.1:${deadPort}/v1` } });
  const t0 = Date.now();
  expectError(await postJson(dead.url, '/v1/chat/completions', chatBody('hi')), 502, 'upstream_unreachable', 'non-stream');
  expectError(await postJson(dead.url, '/v1/chat/completions', chatBody('hi', { stream: true })), 502, 'upstream_unreachable', 'stream');
  assert.ok(Date.now() - t0 < 4000, 'refused connections fail fast');
  const bad = await openaiClient(dead);
  await assert.rejects(bad.chat.completions.create(chatBody('hi')), (e) => e.status === 502);
  await dead.stop();
});

test('504 upstream_timeout when the first byte is late or never comes', async () => {
  for (const knob of [`delay_ms=${FIRST_BYTE_TIMEOUT + 2000}`, 'hang=1']) {
    for (const stream of [false, true]) {
      await mock.reset();
      const t0 = Date.now();
      const res = await postJson(gw.url, '/v1/chat/completions', chatBody(`late [mock ${knob}]`, { stream }));
      const took = Date.now() - t0;
      expectError(res, 504, 'upstream_timeout', `${knob} stream=${stream}`);
      assert.ok(took >= FIRST_BYTE_TIMEOUT - 100 && took < FIRST_BYTE_TIMEOUT + 1500,
        `timed out after ${took} ms (first_byte_timeout_ms ${FIRST_BYTE_TIMEOUT})`);
      // The gateway gave up on the upstream call: it closes that connection.
      await sleep(300);
      assert.equal((await mock.stats()).inflight, 0, 'the timed-out upstream call was closed');
    }
  }
});

test('upstream 429 and 500 pass through with the upstream body', async () => {
  for (const knob of ['status=429 retry_after=7', 'status=500']) {
    const body = chatBody(`fail [mock ${knob}]`);
    const direct = await mockDirect(mock, body).catch(() => null);
    const res = await postJson(gw.url, '/v1/chat/completions', body);
    const status = Number(/status=(\d+)/.exec(knob)[1]);
    assert.equal(res.status, status, res.text);
    assert.ok(res.headers.get('x-request-id'));
    if (direct) assert.deepEqual(res.json, JSON.parse(direct.text), 'the upstream body, unchanged');
    assert.ok(res.json?.error, 'an error object');
  }
  const r = await client.chat.completions.create(chatBody('fail [mock status=429 retry_after=1]')).catch((e) => e);
  assert.equal(r.status, 429);
  assert.equal(r.constructor.name, 'RateLimitError');
});

// ---------------------------------------------------------------- hostile bytes

test('a 100 KB header line: 431 or 400, then the connection is closed', async () => {
  const bytes = `GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'a'.repeat(100 * 1024)}\r\n\r\n`;
  const { res, closed } = await rawOnce(bytes, { closeWait: 3000 });
  assert.ok(res, 'a response before the close');
  assert.ok([431, 400].includes(res.status), `status ${res.status}`);
  assert.ok(closed, 'connection closed after the error');
});

test('many headers adding up past max_header_bytes: 431 or 400', async () => {
  const hs = Array.from({ length: 400 }, (_, i) => `X-H${i}: ${'b'.repeat(60)}\r\n`).join('');
  const { res, closed } = await rawOnce(`GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n${hs}\r\n`, { closeWait: 3000 });
  assert.ok(res && [431, 400].includes(res.status), `status ${res?.status}`);
  assert.ok(closed);
});

test('a request line of garbage bytes: 400', async () => {
  const garbage = Buffer.from([0x00, 0xff, 0x13, 0x37, 0x80, 0x0d, 0x47, 0x20, 0x2f, 0x20, 0x0d, 0x0a, 0x0d, 0x0a]);
  const { res, closed } = await rawOnce(garbage, { closeWait: 3000 });
  assert.ok(res, 'a response');
  assert.equal(res.status, 400);
  assert.ok(closed, 'connection closed after a parse error');
  const { res: res2 } = await rawOnce('HELLO\r\n\r\n', { closeWait: 3000 });
  assert.equal(res2?.status, 400);
});

test('a chunked request body is read and forwarded correctly', async () => {
  const body = JSON.stringify(chatBody('chunked upload [mock chunks=3]'));
  const parts = [body.slice(0, 7), body.slice(7, 30), body.slice(30)];
  const c = await RawConn.open(gw.port);
  await c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
    'Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n');
  for (const p of parts) {
    await c.write(`${Buffer.byteLength(p).toString(16)}\r\n${p}\r\n`);
    await sleep(20);
  }
  await c.write('0\r\n\r\n');
  const res = await c.response(5000);
  c.destroy();
  assert.equal(res?.status, 200, res?.text);
  assert.equal(res.json.usage.completion_tokens, 3);
  const last = await mock.last();
  assert.deepEqual(JSON.parse(last.body).messages, JSON.parse(body).messages, 'the upstream got the whole body');
});

test('Content-Length larger than the body sent: no upstream call, closed after body_timeout_ms', async () => {
  await noUpstreamCall(async () => {
    const body = JSON.stringify(chatBody('short'));
    const c = await RawConn.open(gw.port);
    const t0 = Date.now();
    await c.write(rawRequest('POST', '/v1/chat/completions', {
      body: body.slice(0, 20), headers: { 'content-length': String(body.length) },
    }));
    const closed = await c.waitClose(BODY_TIMEOUT + 3000);
    const took = Date.now() - t0;
    const res = c.buf.length ? (await c.response(10)) : null;
    c.destroy();
    assert.ok(closed, 'the stalled body is not waited for forever');
    assert.ok(took >= BODY_TIMEOUT - 200, `closed after ${took} ms, not before body_timeout_ms`);
    if (res) assert.ok([400, 408].includes(res.status), `status ${res.status}`);
  });
});

test('Content-Length smaller than the body: the truncated JSON is a 400', async () => {
  await noUpstreamCall(async () => {
    const body = JSON.stringify(chatBody('long enough body'));
    const { res } = await rawOnce(rawRequest('POST', '/v1/chat/completions', {
      body, headers: { 'content-length': String(body.length - 10) },
    }), { closeWait: 1000 });
    assert.ok(res, 'a response');
    assert.equal(res.status, 400);
  });
});

test('negative or non-numeric Content-Length: 400', async () => {
  await noUpstreamCall(async () => {
    for (const cl of ['-5', '12abc', '1, 2']) {
      const { res, closed } = await rawOnce(rawRequest('POST', '/v1/chat/completions', {
        body: '{}', headers: { 'content-length': cl },
      }), { closeWait: 2000 });
      assert.equal(res?.status, 400, `Content-Length: ${cl}`);
      assert.ok(closed, `closed after Content-Length: ${cl}`);
    }
  });
});

test('both Content-Length and Transfer-Encoding (request smuggling): 400', async () => {
  await noUpstreamCall(async () => {
    const body = JSON.stringify(chatBody('smuggle'));
    const chunked = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
    const { res } = await rawOnce(rawRequest('POST', '/v1/chat/completions', {
      body: chunked, headers: { 'content-length': '5', 'transfer-encoding': 'chunked' },
    }), { closeWait: 2000 });
    assert.equal(res?.status, 400);
  });
});

test('JSON-level garbage: non-UTF-8, array, number, wrong types: 400', async () => {
  await noUpstreamCall(async () => {
    const nonUtf8 = Buffer.concat([Buffer.from(`{"model":"${MODEL}","messages":[{"role":"user","content":"`),
      Buffer.from([0xff, 0xfe, 0xc3, 0x28]), Buffer.from('"}]}')]);
    const cases = [
      ['non-UTF-8', nonUtf8, 'invalid_json'],
      ['array', '[1,2,3]'],
      ['number', '42'],
      ['string', '"hello"'],
      ['null', 'null'],
      ['model 123', JSON.stringify({ model: 123, messages: [{ role: 'user', content: 'hi' }] })],
      ['stream "yes"', JSON.stringify({ model: MODEL, stream: 'yes', messages: [{ role: 'user', content: 'hi' }] })],
      ['trailing garbage', `${JSON.stringify(chatBody('hi'))}xyz`, 'invalid_json'],
    ];
    for (const [what, body, code] of cases) {
      const { res } = await rawOnce(rawRequest('POST', '/v1/chat/completions', { body }));
      assert.ok(res, `${what}: a response`);
      expectError(res, 400, code, what);
    }
  });
});

test('deeply nested JSON gets an answer and does not crash the gateway', async () => {
  const body = `{"model":"${MODEL}","x":${'['.repeat(30000)}${']'.repeat(30000)},"messages":[{"role":"user","content":"deep [mock chunks=1]"}]}`;
  const { res } = await rawOnce(rawRequest('POST', '/v1/chat/completions', { body }), { timeout: 5000 });
  assert.ok(res, 'a response');
  assert.ok(res.status === 200 || res.status === 400, `status ${res.status}`);
  assert.ok(gw.proc.running, `gateway alive\n${gw.proc.tail()}`);
});

test('the gateway is still up and serving after all of it', async () => {
  assert.ok(gw.proc.running, `gateway alive\n${gw.proc.tail()}`);
  const h = await fetchT(`${gw.url}/healthz`);
  assert.equal(h.status, 200);
  await normalRequestWorks();
  const res = await client.chat.completions.create(chatBody('final [mock chunks=3]'));
  assert.equal(res.usage.completion_tokens, 3);
  assert.ok(!gw.proc.lines.stderr.some((l) => /AddressSanitizer|runtime error:|LeakSanitizer/.test(l)), 'no sanitizer reports');
});
