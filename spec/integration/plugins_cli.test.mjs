// Plugins from the operator's side: `tollgate check` validates every enabled plugin
// (one clear line and exit 2 on a problem), and SIGHUP reloads them when the file
// watch is off.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { REPO, TG_BIN, chatBody, postJson, startGateway, startMock, stopAll, tempDir, toLua, waitFor } from './lib/harness.mjs';

after(() => stopAll());

function check(plugins) {
  const dir = tempDir('check');
  const cfg = path.join(dir, 'tollgate.lua');
  fs.writeFileSync(cfg, `return ${toLua({ upstream: { url: 'http://127.0.0.1:9/v1' }, plugins })}\n`);
  return spawnSync(TG_BIN, ['check', '-c', cfg], { encoding: 'utf8', timeout: 20000 });
}

test('tollgate check lists every shipped plugin and example policy', () => {
  const r = check({
    dirs: [path.join(REPO, 'plugins'), path.join(REPO, 'policies')],
    enabled: ['model-map', 'router', 'retry-budget', 'fail-policy', 'pricing',
      'cheapest-fast', 'tenant-region', 'business-hours-model'],
  });
  assert.equal(r.status, 0, r.stderr + r.stdout);
  for (const name of ['model-map', 'router', 'retry-budget', 'fail-policy', 'pricing']) {
    assert.match(r.stdout, new RegExp(`plugin ok: ${name} 1\\.0\\.0 \\(priority \\d+, hooks [a-z_,]+\\)`));
  }
  assert.match(r.stdout, /config ok/);
});

test('tollgate check names the bad field and exits 2', () => {
  const r = check({
    dirs: [path.join(REPO, 'plugins')],
    enabled: [{ name: 'model-map', config: { aliases: 'gpt-4' } }],
  });
  assert.equal(r.status, 2);
  assert.match(r.stdout + r.stderr, /plugins\.model-map\.config\.aliases: expected table, got string/);
});

test('SIGHUP reloads the plugins', async () => {
  const dir = tempDir('hup');
  const file = path.join(dir, 'hup.lua');
  const src = (v) => `return { name = "hup", priority = 1, version = "${v}",
    on_request = function(ctx) ctx:add_header("x-hup", "${v}") end }\n`;
  fs.writeFileSync(file, src('one'));
  const mock = await startMock();
  const gw = await startGateway({ plugins: { dirs: [dir], enabled: ['hup'], watch: false } }, { mock });
  const version = async () => (await postJson(gw.baseURL, '/chat/completions', chatBody('x'))).headers.get('x-hup');
  assert.equal(await version(), 'one');
  fs.writeFileSync(file, src('two'));
  assert.equal(await version(), 'one'); // no watch: nothing changes by itself
  gw.proc.signal('SIGHUP');
  await waitFor(async () => (await version()) === 'two', { timeout: 5000, what: 'reload on SIGHUP' });
  await gw.proc.waitForLine('stderr', /plugins: generation 2 loaded \(sighup\)/, 5000);
});
