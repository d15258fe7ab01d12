// HEAD answers carry no body (issue #14, hostile item 10). A HEAD response is its head
// only; before the fix the gateway sent the GET's body too, and a keep-alive client read
// those bytes as the start of its next response (desynchronised). Each case sends HEAD
// then GET /healthz pipelined on one keep-alive socket and checks that the bytes after
// the HEAD answer's head are the next response's status line, on the data plane, the
// admin API and the console.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { ADMIN_TOKEN, CLIENT_KEY, HOST, RawConn, parseResponse, startGateway, startMock, stopAll } from './lib/harness.mjs';

let mock;
let gw;

before(async () => {
  mock = await startMock();
  gw = await startGateway({}, { mock });
});

after(stopAll);

/**
 * HEAD `path` then GET /healthz on one connection (written in one go). Resolves with
 * {head: {status, headers}, next: the GET's parsed response}.
 */
async function headThenGet(path, headers = {}) {
  const c = await RawConn.open(gw.port);
  try {
    const h = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
    await c.write(`HEAD ${path} HTTP/1.1\r\nHost: ${HOST}\r\n${h}\r\nGET /healthz HTTP/1.1\r\nHost: ${HOST}\r\n\r\n`);
    // Wait for both heads (and the GET's body), however the HEAD answer is framed.
    const ok = await c.until((x) => {
      const s = x.buf.toString('latin1');
      const second = s.indexOf('HTTP/1.1 ', 1);
      return second > 0 && parseResponse(x.buf.subarray(second)) !== null;
    }, 5000);
    const s = c.buf.toString('latin1');
    const end = s.indexOf('\r\n\r\n');
    assert.ok(end > 0, `${path}: a HEAD answer arrived: ${JSON.stringify(s.slice(0, 200))}`);
    const lines = s.slice(0, end).split('\r\n');
    const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(lines[0])?.[1]);
    const hdrs = Object.fromEntries(lines.slice(1).map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
    const rest = c.buf.subarray(end + 4);
    assert.ok(ok, `${path}: the GET's answer arrived after the HEAD's (got ${JSON.stringify(s.slice(0, 400))})`);
    assert.equal(rest.subarray(0, 9).toString('latin1'), 'HTTP/1.1 ',
      `${path}: bytes after the HEAD answer's head must be the next status line, got ${JSON.stringify(rest.subarray(0, 80).toString('latin1'))}`);
    const next = parseResponse(rest);
    return { head: { status, headers: hdrs }, next };
  } finally {
    c.destroy();
  }
}

const auth = { authorization: `Bearer ${CLIENT_KEY}` };
const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };

for (const [name, path, headers, statuses] of [
  ['data plane: /v1/models', '/v1/models', auth, [200]],
  ['data plane: /v1/models without a key (401)', '/v1/models', {}, [401]],
  ['data plane: /healthz', '/healthz', {}, [200]],
  ['data plane: /metrics', '/metrics', {}, [200]],
  ['data plane: unknown route (404)', '/v1/nope', auth, [404]],
  ['data plane: POST-only route (405)', '/v1/chat/completions', auth, [405]],
  ['admin API: tenants', '/admin/api/v1/tenants', admin, [200, 404, 405, 503]],
  ['admin API: wrong token (401)', '/admin/api/v1/tenants', { authorization: 'Bearer nope' }, [401]],
  ['console: index', '/admin/', {}, [200]],
  ['console: redirect', '/admin', {}, [308]],
  ['console: asset not found', '/admin/nope.js', {}, [404, 200]],
  ['console: session', '/admin/session', {}, [401, 200]],
]) {
  test(`HEAD then GET on one keep-alive connection: ${name}`, async () => {
    const { head, next } = await headThenGet(path, headers);
    assert.ok(statuses.includes(head.status), `${path}: HEAD status ${head.status}`);
    if (head.status === 405) assert.match(head.headers.allow ?? '', /POST/);
    assert.ok(next, 'the GET answer parsed');
    assert.equal(next.status, 200);
    assert.equal(next.text.trim().length > 0, true);
  });
}

test('HEAD /v1/models announces the GET body length it does not send', async () => {
  const c = await RawConn.open(gw.port);
  try {
    await c.write(`GET /v1/models HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${CLIENT_KEY}\r\n\r\n`);
    const get = await c.response();
    assert.equal(get.status, 200);
    const { head } = await headThenGet('/v1/models', auth);
    if (head.headers['content-length'] !== undefined) assert.equal(Number(head.headers['content-length']), get.body.length);
    else assert.match(head.headers['transfer-encoding'] ?? '', /chunked/);
  } finally {
    c.destroy();
  }
});
