// Uploaded policies (POST /admin/api/v1/plugins/validate) are checked as a reload checks
// them, and hostile ones are refused with a message that says what is wrong (and where,
// for Lua errors): syntax errors, endless loops at load and in a hook, files over the
// limit, bytecode, code reaching for io, os, ffi, debug or load. The gateway keeps
// serving throughout.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { ADMIN_TOKEN, REPO, chatBody, postJson, startGateway, startMock, stopAll, tempDir } from './lib/harness.mjs';

let gw;
before(async () => {
  const mock = await startMock();
  gw = await startGateway({ plugins: { dirs: [path.join(REPO, 'plugins')], watch: false, max_hook_ms: 50, enabled: [] } }, { mock });
});
after(() => stopAll());

const upload = (name, source, extra = {}) =>
  postJson(gw.url, '/admin/api/v1/plugins/validate', { name, source, ...extra }, { key: ADMIN_TOKEN, timeout: 20000 });

const policy = (name, body, top = '') => `${top}
return {
  name = "${name}", priority = 800, version = "1.0.0",
${body}
}
`;

test('a sound policy passes and says what it implements', async () => {
  const r = await upload('pick-first', policy('pick-first', `
  schema = { fields = { n = { type = "integer", default = 1 } } },
  select_account = function(ctx, conf) ctx:select(conf.n) end,
  price = function(ctx) ctx:set_cost(42) end,`));
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json, { ok: true, name: 'pick-first', version: '1.0.0', hooks: 'select_account,price' });
});

test('hostile or broken uploads are refused, each with a clear message', async () => {
  const bytecodeFile = path.join(tempDir('bc'), 'bc.lua');
  fs.writeFileSync(bytecodeFile, 'return { name = "bc", priority = 1, version = "1" }');
  const bc = execFileSync('luajit', ['-b', bytecodeFile, '-']).toString('latin1');
  const cases = [
    ['syntax', policy('syntax', 'on_request = function(ctx)\n    if then end\n  end,'), /policies\/syntax\.lua:5: unexpected symbol near 'then'/],
    ['loop-load', policy('loop-load', '', 'while true do end'), /plugins\.loop-load: plugin budget exceeded: ran longer than \d+ ms/],
    ['loop-hook', policy('loop-hook', 'on_request = function(ctx) while true do end end,'),
      /plugins\.loop-hook\.on_request: plugin budget exceeded: ran longer than 50 ms \(dry run on a sample request\)/],
    ['huge', `-- ${'x'.repeat(300 * 1024)}\n${policy('huge', '')}`, /^source: 30\d+ bytes, over the limit of 262144$/],
    ['bc', bc, /^source: bytecode is not accepted/],
    ['reads-io', policy('reads-io', '', 'local f = io.open("/etc/passwd")'), /policies\/reads-io\.lua:1: attempt to index global 'io' \(a nil value\)/],
    ['runs-os', policy('runs-os', 'on_request = function(ctx) os.execute("touch /tmp/pwned") end,'),
      /plugins\.runs-os\.on_request: policies\/runs-os\.lua:4: attempt to call field 'execute' \(a nil value\)/],
    ['wants-ffi', policy('wants-ffi', '', 'local ffi = require("ffi")'), /require\('ffi'\) is not allowed \(plugins may require only 'tollgate'\)/],
    ['debug', policy('debug', '', 'local d = debug.getinfo(1)'), /attempt to index global 'debug' \(a nil value\)/],
    ['loads', policy('loads', '', 'local f = loadstring("return 1")'), /attempt to call global 'loadstring' \(a nil value\)/],
    ['misnamed', policy('other-name', ''), /has name = other-name, expected "misnamed"/],
    ['bad-hook', policy('bad-hook', 'on_requst = function() end,'), /plugins\.bad-hook: unknown key 'on_requst'/],
    ['Bad Name', policy('x', ''), /^name: a policy name holds only a-z, 0-9, - and _/],
  ];
  for (const [name, src, re] of cases) {
    const r = await upload(name, src);
    assert.equal(r.status, 422, `${name}: ${r.status} ${r.text.slice(0, 300)}`);
    assert.equal(r.json.error.code, 'policy_invalid', name);
    assert.match(r.json.error.message, re, name);
  }
  assert.ok(!fs.existsSync('/tmp/pwned'));
  // A config is checked against the policy's schema too.
  const r = await upload('typed', policy('typed', 'schema = { fields = { n = { type = "integer" } } },'), { config_lua: '{n = "x"}' });
  assert.equal(r.status, 422);
  assert.match(r.json.error.message, /plugins\.typed\.config\.n: expected integer, got string/);
  const shape = await postJson(gw.url, '/admin/api/v1/plugins/validate', { name: 'x' }, { key: ADMIN_TOKEN });
  assert.equal(shape.status, 400);
  // The gateway served on.
  const ok = await postJson(gw.baseURL, '/chat/completions', chatBody('still here [mock chunks=1]'));
  assert.equal(ok.status, 200, ok.text);
});
