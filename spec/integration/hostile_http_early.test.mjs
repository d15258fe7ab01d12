// Early answers are read, not reset (issue #14, hostile item 5). A body over the limit
// sent whole without `Expect: 100-continue` (Node's fetch, the openai SDK, Python) is
// answered 413 while the client is still sending; closing a socket with unread input
// makes the kernel send a reset, and the client saw "Connection error" instead of the
// 413 (then the SDK retried the upload). The gateway now answers, shuts its side down,
// and drains (bounded) until the client closes. The same for every answer that ends a
// connection: 431, a 401 with more requests behind it, the admin API's 413.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';

import { ADMIN_TOKEN, CLIENT_KEY, HOST, openaiClient, parseResponse, startGateway, startMock, stopAll } from './lib/harness.mjs';

const LIMIT = 65536;
let mock;
let gw;

before(async () => {
  mock = await startMock();
  gw = await startGateway({ limits: { max_body_bytes: LIMIT } }, { mock });
});

after(stopAll);

/**
 * Writes `head` then `body` (a Buffer, written in one go as a client that does not wait
 * for 100-continue does), reading all the while. Resolves with {res, error, bytes} once
 * the peer closes or `timeout` ms pass: `res` is the first response parsed from what
 * arrived, `error` the socket error seen (ECONNRESET before the fix).
 */
function sendWhole(head, body, { timeout = 10000 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(gw.port, HOST);
    let buf = Buffer.alloc(0);
    let error = null;
    const finish = () => {
      clearTimeout(timer);
      let res = null;
      try {
        res = parseResponse(buf, true);
      } catch {
        res = null;
      }
      sock.destroy();
      resolve({ res, error, bytes: buf.length });
    };
    const timer = setTimeout(finish, timeout);
    sock.on('connect', () => {
      sock.write(head);
      sock.write(body, () => {});
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
    });
    sock.on('error', (e) => {
      error = e.code;
    });
    sock.on('close', finish);
  });
}

function bigChat(bytes) {
  return Buffer.from(JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x'.repeat(bytes) }] }));
}

test('the openai SDK sending a body over the limit gets a 413 APIError, not a connection error', async () => {
  const client = await openaiClient(gw);
  const { APIError, APIConnectionError } = await import('openai');
  for (const size of [LIMIT * 4, 4 << 20]) {
    let err;
    try {
      await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x'.repeat(size) }] });
    } catch (e) {
      err = e;
    }
    assert.ok(err, 'the request failed');
    assert.ok(!(err instanceof APIConnectionError), `${size} B: got a connection error: ${err.message}`);
    assert.ok(err instanceof APIError, `${size} B: ${err}`);
    assert.equal(err.status, 413);
    assert.equal(err.error?.code ?? err.code, 'body_too_large');
  }
  const stats = await mock.stats();
  assert.equal(stats.total, 0, 'nothing reached the upstream');
});

test('the Anthropic SDK sending a body over the limit gets a 413 request_too_large APIError', async () => {
  const { default: Anthropic, APIError, APIConnectionError } = await import('@anthropic-ai/sdk');
  const client = new Anthropic({ apiKey: CLIENT_KEY, baseURL: gw.url, maxRetries: 0, timeout: 30000 });
  let err;
  try {
    await client.messages.create({ model: 'mock-claude', max_tokens: 10, messages: [{ role: 'user', content: 'x'.repeat(4 << 20) }] });
  } catch (e) {
    err = e;
  }
  assert.ok(err, 'the request failed');
  assert.ok(!(err instanceof APIConnectionError), `got a connection error: ${err.message}`);
  assert.ok(err instanceof APIError, String(err));
  assert.equal(err.status, 413);
  assert.equal(err.error?.type, 'error', 'the Anthropic error shape');
  assert.equal(err.error?.error?.type, 'request_too_large');
});

test('raw socket: 1 MB and 8 MB bodies sent whole get the 413 in full, then a FIN, no reset', async () => {
  for (const size of [1 << 20, 8 << 20]) {
    const body = bigChat(size);
    const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
    const got = await sendWhole(head, body);
    assert.equal(got.error, null, `${size} B: socket error ${got.error} (${got.bytes} bytes received)`);
    assert.ok(got.res, `${size} B: a whole response arrived`);
    assert.equal(got.res.status, 413);
    assert.equal(got.res.json.error.code, 'body_too_large');
    assert.equal(got.res.headers.connection, 'close');
  }
});

test('raw socket: a chunked body over the limit gets the 413, no reset', async () => {
  const chunk = Buffer.alloc(32768, 'a');
  const parts = [];
  for (let i = 0; i < 64; i++) parts.push(Buffer.from('8000\r\n'), chunk, Buffer.from('\r\n'));
  parts.push(Buffer.from('0\r\n\r\n'));
  const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
    'Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n';
  const got = await sendWhole(head, Buffer.concat(parts));
  assert.equal(got.error, null, `socket error ${got.error}`);
  assert.equal(got.res?.status, 413);
});

test('raw socket: the admin API answers a body over the limit 413, no reset', async () => {
  const body = Buffer.from(JSON.stringify({ name: 't'.repeat(2 << 20) }));
  const head = `POST /admin/api/v1/tenants HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${ADMIN_TOKEN}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
  const got = await sendWhole(head, body);
  assert.equal(got.error, null, `socket error ${got.error}`);
  assert.equal(got.res?.status, 413);
  assert.equal(got.res.json.error.code, 'body_too_large');
});

test('raw socket: a 431 for huge headers with a large body behind them, no reset', async () => {
  const body = bigChat(8 << 20);
  const head = `POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
    `X-Big: ${'h'.repeat(20000)}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`;
  const got = await sendWhole(head, body);
  assert.equal(got.error, null, `socket error ${got.error}`);
  assert.equal(got.res?.status, 431);
});

test('raw socket: a 401 with Connection: close and more requests behind it, no reset', async () => {
  for (const [p, auth] of [['/v1/chat/completions', 'Bearer wrong-key'], ['/admin/api/v1/tenants', 'Bearer wrong-admin']]) {
    const small = Buffer.from(JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }));
    const first = `POST ${p} HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: ${auth}\r\nConnection: close\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${small.length}\r\n\r\n${small}`;
    // What a client pipelines behind it: never answered, must not cost the 401.
    const more = bigChat(2 << 20);
    const second = `POST ${p} HTTP/1.1\r\nHost: ${HOST}\r\nContent-Type: application/json\r\nContent-Length: ${more.length}\r\n\r\n`;
    const got = await sendWhole(first + second, more);
    assert.equal(got.error, null, `${p}: socket error ${got.error}`);
    assert.equal(got.res?.status, 401, p);
  }
});

test('lingering is bounded: a client that keeps sending is closed within the time bound', async () => {
  const sock = net.connect(gw.port, HOST);
  await new Promise((r) => sock.on('connect', r));
  sock.on('error', () => {});
  sock.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${1 << 30}\r\n\r\n`);
  let buf = Buffer.alloc(0);
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
  });
  const closed = new Promise((r) => sock.on('close', r));
  const start = Date.now();
  // A trickle of bytes, one write every 500 ms: never a gap long enough to end the linger.
  const trickle = setInterval(() => {
    if (!sock.destroyed) sock.write('x'.repeat(1000));
  }, 500);
  const t = await Promise.race([closed.then(() => Date.now() - start), new Promise((r) => setTimeout(() => r(null), 20000))]);
  clearInterval(trickle);
  sock.destroy();
  assert.ok(t !== null, 'the gateway closed the connection');
  assert.ok(t < 15000, `closed after ${t} ms`);
  assert.equal(parseResponse(buf, true)?.status, 413);
});
