// Plugin failures never cost a request: a syntax error is refused and the old
// generation keeps serving; a plugin that throws falls back and is counted in the
// access log; an endless loop is cut off by the watchdog; a rejection reaches the
// client as an OpenAI-shaped error.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { chatBody, postJson, sleep, startGateway, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';

const policy = (v) => `
local V = "${v}"
return {
  name = "faulty", priority = 10, version = V,
  on_request = function(ctx)
    if ctx:header("x-boom") then error("boom " .. V) end
    if ctx:header("x-spin") then while true do end end
    if ctx:header("x-block") then return ctx:reject(403, "blocked_by_policy", "tenant is blocked") end
    ctx:add_header("x-policy-version", V)
  end,
}
`;

let mock;
let gw;
let file;

before(async () => {
  const dir = tempDir('policies');
  file = path.join(dir, 'faulty.lua');
  fs.writeFileSync(file, policy('v1'));
  mock = await startMock();
  gw = await startGateway({
    plugins: { dirs: [dir], enabled: [{ name: 'faulty' }], watch: true, max_hook_ms: 50 },
  }, { mock });
});

after(() => stopAll());

const send = (headers = {}) => postJson(gw.baseURL, '/chat/completions', chatBody('hi'), { headers });

test('a syntax error is refused whole; the old generation keeps serving', async () => {
  assert.equal((await send()).headers.get('x-policy-version'), 'v1');
  fs.writeFileSync(file, 'return { name = "faulty", priority = ');
  await gw.proc.waitForLine('stderr', /reload \(watch\) refused.*faulty\.lua:1:/, 5000);
  for (let i = 0; i < 10; i++) {
    const r = await send();
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('x-policy-version'), 'v1');
  }
  fs.writeFileSync(file, policy('v2'));
  await waitFor(async () => (await send()).headers.get('x-policy-version') === 'v2',
    { timeout: 5000, what: 'v2 serving' });
});

test('a plugin that throws falls back: the request succeeds and the error is counted', async () => {
  const r = await send({ 'x-boom': '1' });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-policy-version'), null);
  const id = r.headers.get('x-request-id');
  const line = await gw.proc.waitForLine('stdout', new RegExp(`"request_id":"${id}"`), 5000);
  assert.match(line, /"plugins":\{"generation":\d+,"errors":1/);
  await gw.proc.waitForLine('stderr', new RegExp(`request ${id}: plugin faulty failed in on_request.*boom v2`), 5000);
});

test('an endless loop is cut off and the request still succeeds', async () => {
  const t0 = Date.now();
  const r = await send({ 'x-spin': '1' });
  assert.equal(r.status, 200);
  assert.ok(Date.now() - t0 < 3000, `took ${Date.now() - t0} ms`);
  const id = r.headers.get('x-request-id');
  await gw.proc.waitForLine('stderr', new RegExp(`request ${id}: plugin .* budget exceeded`), 5000);
  // The worker is healthy afterwards.
  for (let i = 0; i < 5; i++) assert.equal((await send()).status, 200);
});

test('a rejection reaches the client as an OpenAI-shaped error', async () => {
  const r = await send({ 'x-block': '1' });
  assert.equal(r.status, 403);
  assert.equal(r.json.error.code, 'blocked_by_policy');
  assert.equal(r.json.error.message, 'tenant is blocked');
  await sleep(10);
});
