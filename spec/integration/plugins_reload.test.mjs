// Hot reload under load: a plugin file is rewritten 100 times while 50 clients send
// requests. No request may fail, and each must be decided by exactly one generation:
// the plugin stamps its version from on_request and again from map_model into two
// response headers, which must agree, and every generation number the gateway reports
// (x-tollgate-generation) must always come with the same version.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import { chatBody, postJson, sleep, startGateway, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';

const stamp = (v) => `-- written by plugins_reload.test.mjs
local V = "${v}"
return {
  name = "stamp", priority = 10, version = V,
  on_request = function(ctx) ctx:add_header("x-stamp-a", V) end,
  map_model = function(ctx) ctx:add_header("x-stamp-b", V) end,
}
`;

let mock;
let gw;
let dir;

before(async () => {
  dir = tempDir('plugins');
  fs.mkdirSync(path.join(dir, 'stamp'));
  fs.writeFileSync(path.join(dir, 'stamp', 'handler.lua'), stamp('v0'));
  mock = await startMock();
  gw = await startGateway({ plugins: { dirs: [dir], enabled: [{ name: 'stamp' }], watch: true } }, { mock });
});

after(() => stopAll());

test('100 rewrites under 50 clients: zero failures, one generation per request', async (t) => {
  const results = [];
  let stop = false;
  const client = async () => {
    while (!stop) {
      try {
        const r = await postJson(gw.baseURL, '/chat/completions', chatBody('hello'), { timeout: 10000 });
        results.push({
          status: r.status,
          a: r.headers.get('x-stamp-a'),
          b: r.headers.get('x-stamp-b'),
          gen: r.headers.get('x-tollgate-generation'),
        });
      } catch (e) {
        results.push({ status: 0, error: String(e) });
      }
    }
  };
  const clients = Array.from({ length: 50 }, client);

  const file = path.join(dir, 'stamp', 'handler.lua');
  for (let i = 1; i <= 100; i++) {
    fs.writeFileSync(file, stamp(`v${i}`)); // in place: the watcher may see half a file
    await sleep(15);
  }
  // The last version must win once the watcher has settled.
  await waitFor(async () => {
    const r = await postJson(gw.baseURL, '/chat/completions', chatBody('hello'));
    return r.headers.get('x-stamp-a') === 'v100';
  }, { timeout: 10000, what: 'version v100 serving' });
  stop = true;
  await Promise.all(clients);

  const failed = results.filter((r) => r.status !== 200);
  assert.equal(failed.length, 0, `failed requests: ${JSON.stringify(failed.slice(0, 5))}`);
  assert.ok(results.length >= 500, `only ${results.length} requests were sent`);
  const genVersion = new Map();
  for (const r of results) {
    assert.ok(r.a, 'x-stamp-a missing');
    assert.equal(r.a, r.b, 'on_request and map_model of one request ran in different generations');
    assert.ok(r.gen, 'x-tollgate-generation missing');
    const seen = genVersion.get(r.gen);
    if (seen) assert.equal(seen, r.a, `generation ${r.gen} served two versions`);
    else genVersion.set(r.gen, r.a);
  }
  const versions = new Set(results.map((r) => r.a));
  t.diagnostic(`${results.length} requests, ${versions.size} versions, ${genVersion.size} generations served`);
  assert.ok(versions.size >= 5, `only ${versions.size} versions served: reloads did not happen under load`);
  assert.ok(genVersion.size >= 5, `only ${genVersion.size} generations`);
});
