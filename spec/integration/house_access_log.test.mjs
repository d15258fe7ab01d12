// One access-log writer (issue #16, house item 2c): the data plane, the admin API, the
// console and the answers the server gives itself each write their line through one
// function, so every line carries the same members under the same names. Before, each
// wrote its own: the admin API's and the console's lines had no client_ip, bytes_in
// (the admin API's no bytes_out either), so a line could not be traced to a client.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import {
  ADMIN_TOKEN, HOST, MODEL, RawConn, fetchT, openaiClient, startGateway, startMock, stopAll, waitFor,
} from './lib/harness.mjs';

let mock;
let gw;

before(async () => {
  mock = await startMock();
  gw = await startGateway({}, { mock });
});

after(stopAll);

function lineOf(id) {
  const all = gw.proc.lines.stdout.map((l) => JSON.parse(l));
  const mine = all.filter((o) => o.request_id === id);
  return mine.length === 1 ? mine[0] : null;
}

/** The line of request `id`, with the members every line has checked. */
async function commonLine(id, { route, method, path, status }) {
  assert.ok(id, 'the answer has an x-request-id');
  await waitFor(() => lineOf(id), { timeout: 3000, what: `the access-log line of ${id}` });
  const line = lineOf(id);
  assert.equal(typeof line.ts, 'number', 'ts');
  assert.equal(line.route, route, 'route');
  assert.equal(line.method, method, 'method');
  assert.equal(line.path, path, 'path');
  assert.equal(line.status, status, 'status');
  assert.equal(line.client_ip, HOST, 'client_ip');
  assert.equal(typeof line.bytes_in, 'number', 'bytes_in');
  assert.ok(line.bytes_in > 0, 'bytes_in counts the request');
  assert.equal(typeof line.bytes_out, 'number', 'bytes_out');
  assert.ok(line.bytes_out > 0, 'bytes_out counts the answer');
  assert.equal(typeof line.total_ms, 'number', 'total_ms');
  return line;
}

test('the data plane line: the common members and its own', async () => {
  const client = await openaiClient(gw);
  const { response } = await client.chat.completions
    .create({ model: MODEL, messages: [{ role: 'user', content: 'hello' }] })
    .withResponse();
  const line = await commonLine(response.headers.get('x-request-id'), {
    route: 'chat_completions', method: 'POST', path: '/v1/chat/completions', status: 200,
  });
  assert.equal(line.model, MODEL);
  assert.equal(line.upstream_status, 200);
  assert.equal(typeof line.ttft_ms, 'number');
  assert.equal(typeof line.upstream_ms, 'number');
  assert.equal(typeof line.overhead_ms, 'number');
  assert.equal(line.error, undefined);
});

test('the admin API line has the same members', async () => {
  const r = await fetchT(`${gw.url}/admin/api/v1/tenants?limit=5`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  await r.text();
  await commonLine(r.headers.get('x-request-id'), {
    route: 'admin', method: 'GET', path: '/admin/api/v1/tenants', status: r.status,
  });
});

test('the console line has the same members', async () => {
  const r = await fetchT(`${gw.url}/admin/`);
  await r.text();
  assert.equal(r.status, 200);
  await commonLine(r.headers.get('x-request-id'), { route: 'admin_ui', method: 'GET', path: '/admin/', status: 200 });
});

test("the server's own answer (400 from the parser) has the same members", async () => {
  const c = await RawConn.open(gw.port);
  try {
    await c.write('GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n');
    const res = await c.response(5000);
    assert.equal(res.status, 400);
    const line = await commonLine(res.headers['x-request-id'], { route: 'other', method: 'GET', path: '/v1/models', status: 400 });
    assert.equal(line.error, res.json.error.code);
  } finally {
    c.destroy();
  }
});
