// The access log has a line for every request (issue #14, hostile item 12), and every
// line is one valid JSON object (item 7). Before the fix requests refused by the HTTP
// parser (400), not received in time (408) or over a size limit (413, 431) wrote no
// line at all, though the README says every request does. Each case here is sent on a
// raw socket; its answer's x-request-id must have exactly one access-log line with the
// answer's status and error code, and every line on stdout must parse as JSON.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { CLIENT_KEY, HOST, RawConn, sleep, startGateway, startMock, stopAll, waitFor } from './lib/harness.mjs';

let mock;
let gw;

before(async () => {
  mock = await startMock();
  gw = await startGateway({
    limits: { max_body_bytes: 65536, max_header_bytes: 8192, header_timeout_ms: 1000, body_timeout_ms: 1000 },
  }, { mock });
});

after(stopAll);

/** Sends raw bytes (then waits `pause` ms for a timeout case) and returns the answer. */
async function answer(bytes, { pause = 0 } = {}) {
  const c = await RawConn.open(gw.port);
  try {
    await c.write(bytes);
    if (pause) await sleep(pause);
    const res = await c.response(5000);
    assert.ok(res, 'an answer arrived');
    return res;
  } finally {
    c.destroy();
  }
}

/** Every stdout line parsed (all must be JSON); the ones with this request id. */
function linesOf(id) {
  const all = gw.proc.lines.stdout.map((l) => {
    try {
      return JSON.parse(l);
    } catch {
      assert.fail(`an access-log line is not valid JSON: ${JSON.stringify(l)}`);
    }
    return null;
  });
  return all.filter((o) => o.request_id === id);
}

async function logged(res) {
  const id = res.headers['x-request-id'];
  assert.ok(id, 'the answer has an x-request-id');
  await waitFor(() => linesOf(id).length > 0, { timeout: 3000, what: `an access-log line for ${id} (${res.status})` });
  const mine = linesOf(id);
  assert.equal(mine.length, 1, 'exactly one line');
  const line = mine[0];
  assert.equal(line.status, res.status);
  assert.equal(line.error, res.json.error.code);
  assert.equal(typeof line.ts, 'number');
  assert.equal(line.client_ip, HOST);
  assert.equal(typeof line.total_ms, 'number');
  return line;
}

test('400 from the parser (an unknown method) is access-logged', async () => {
  const res = await answer(`BREW /v1/models HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`);
  assert.equal(res.status, 400);
  await logged(res);
});

test('400 from the parser (a malformed header line) is access-logged with its method and path', async () => {
  const res = await answer(`GET /v1/models HTTP/1.1\r\nHost: ${HOST}\r\nBad Header Line\r\n\r\n`);
  assert.equal(res.status, 400);
  const line = await logged(res);
  assert.equal(line.method, 'GET');
  assert.equal(line.path, '/v1/models');
});

test('431 for headers over the limit is access-logged', async () => {
  const res = await answer(`GET /v1/models HTTP/1.1\r\nHost: ${HOST}\r\nX-Big: ${'a'.repeat(10000)}\r\n\r\n`);
  assert.equal(res.status, 431);
  const line = await logged(res);
  assert.equal(line.error, 'headers_too_large');
});

test('413 for a body over the limit is access-logged', async () => {
  const res = await answer(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
    'Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"model":');
  assert.equal(res.status, 413);
  const line = await logged(res);
  assert.equal(line.method, 'POST');
  assert.equal(line.path, '/v1/chat/completions');
  assert.equal(line.error, 'body_too_large');
});

test('408 for headers not received in time is access-logged', async () => {
  const res = await answer(`GET /v1/models HTTP/1.1\r\nHost: ${HOST}\r\n`, { pause: 1500 });
  assert.equal(res.status, 408);
  const line = await logged(res);
  assert.equal(line.error, 'request_timeout');
});

test('408 for a body not received in time is access-logged', async () => {
  const res = await answer(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
    'Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{"mo', { pause: 1500 });
  assert.equal(res.status, 408);
  const line = await logged(res);
  assert.equal(line.method, 'POST');
});

test('400 for a bad byte in the target is logged with the method parsed before it', async () => {
  const res = await answer(Buffer.concat([
    Buffer.from('GET /v1/x'), Buffer.from([0xff, 0xfe]), Buffer.from(`y HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`),
  ]));
  assert.equal(res.status, 400);
  const line = await logged(res);
  assert.equal(line.method, 'GET');
});

test('a model with CR, LF and control bytes stays inside one valid JSON access-log line', async () => {
  const model = 'm\r\n{"ts":1,"request_id":"forged"}\u0001\u007f';
  const body = JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] });
  const res = await answer(`POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n` +
    `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  const id = res.headers['x-request-id'];
  await waitFor(() => linesOf(id).length > 0, { timeout: 3000, what: 'the line' });
  const [line] = linesOf(id);
  assert.equal(line.model, model, 'the model reads back exactly');
  assert.equal(linesOf('forged').length, 0, 'no forged line');
});
