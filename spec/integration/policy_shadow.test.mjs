// Shadow plugins: a group's plugin with "mode": "shadow" runs at its hooks on live
// requests beside the live policy, on a copy of the context. Its decisions are compared
// and counted (/metrics, the plugins status with samples of disagreements) and never
// applied: here it rejects every request, maps the model, always picks account d, prices
// at zero, adds a header, and spins forever in on_upstream_error — and the mock sees the
// requests exactly as the live router sends them, every client gets its 200, and the
// endless loop is cut by max_hook_ms and counted as the shadow's error.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { MODEL, REPO, parseMetrics, fetchT, tempDir, waitFor } from './lib/harness.mjs';
import { adminClient } from './lib/db.mjs';
import { sendMany, startRouting, statuses } from './lib/routing.mjs';

const SHADOW = `return {
  name = "evil-shadow", priority = 900, version = "1.0.0",
  on_request = function(ctx)
    ctx:add_header("x-shadow", "1")
    ctx:log_field("shadow", "was here")
    return ctx:reject(403, "shadow_says_no", "the shadow refuses")
  end,
  map_model = function(ctx) ctx:set_model("shadow-model") end,
  select_account = function(ctx)
    for i = 1, ctx:naccounts() do
      if ctx:account(i).id == "d" then return ctx:select(i) end
    end
  end,
  on_upstream_error = function(ctx)
    -- Passes the dry run of validation; spins on a live request.
    if ctx:request_id() ~= "dry-run" then while true do end end
    ctx:give_up()
  end,
  price = function(ctx) ctx:set_cost(0) end,
}
`;

let rt;
let admin;
let group;

before(async () => {
  const dir = tempDir('shadow');
  fs.writeFileSync(path.join(dir, 'evil-shadow.lua'), SHADOW);
  rt = await startRouting({
    accounts: [{ name: 'a' }, { name: 'b' }, { name: 'c' }, { name: 'd' }],
    routing: { cooldown_5xx_ms: 60000, max_attempts: 3 },
    gateway: {
      plugins: {
        dirs: [path.join(REPO, 'plugins'), dir],
        watch: false,
        max_hook_ms: 20,
        enabled: [{ name: 'router' }],
      },
    },
  });
  admin = adminClient(rt.gw);
  group = (await admin.read('/groups')).data.find((g) => g.name === 'pool');
});

after(() => rt?.stop());

const shadowMetrics = async () => {
  const text = await (await fetchT(`${rt.gw.url}/metrics`)).text();
  const out = {};
  for (const m of parseMetrics(text)) {
    if (m.name === 'tollgate_plugin_shadow_total') out[`${m.labels.hook}.${m.labels.result}`] = m.value;
  }
  return out;
};

test('a shadow plugin decides nothing: the mock sees the live router\'s requests, clients get 200', async () => {
  const before = await shadowMetrics();
  assert.equal(before['on_request.disagree'], 0, 'no shadow yet');
  const upd = await admin.update(`/groups/${group.id}`, { plugins: { 'evil-shadow': { mode: 'shadow' } } });
  assert.deepEqual(upd.plugins, { 'evil-shadow': { mode: 'shadow' } });
  // The group's setting reaches the workers with the key cache's invalidation.
  await waitFor(async () => {
    await rt.chat('probe [mock chunks=1]');
    return (await shadowMetrics())['on_request.disagree'] > 0;
  }, { timeout: 10000, what: 'the shadow to run' });
  await rt.mock.reset();
  const m0 = await shadowMetrics();
  // Account a fails: requests are retried, and the shadow's on_upstream_error spins.
  await rt.fault('a', { status: 500 });
  const N = 60;
  const rs = await sendMany(rt, N, (i) => [`shadowed ${i} [mock chunks=2]`], { concurrency: 6 });
  assert.deepEqual(statuses(rs), { 200: N }, 'the shadow\'s rejection never reaches a client');
  for (const r of rs) assert.equal(r.headers['x-shadow'], undefined, 'nor its headers');
  const counts = await rt.counts();
  const served = (counts.b || 0) + (counts.c || 0) + (counts.d || 0);
  assert.equal(served, N, `every request was served once by a healthy account (${JSON.stringify(counts)})`);
  assert.ok((counts.d || 0) < N * 0.6, `the shadow's pick (d) is not applied: ${JSON.stringify(counts)}`);
  const last = await rt.mock.last();
  assert.equal(JSON.parse(last.body).model, MODEL, 'the model the mock sees is the client\'s, not the shadow\'s');
  const m = await shadowMetrics();
  const d = (k) => (m[k] || 0) - (m0[k] || 0);
  assert.equal(d('on_request.disagree'), N, 'every on_request disagreement is counted');
  assert.equal(d('map_model.disagree'), N);
  assert.ok(d('select_account.disagree') > 0 && d('select_account.agree') > 0, JSON.stringify(m));
  assert.ok(d('on_upstream_error.error') > 0, `the spinning shadow is cut by max_hook_ms and counted: ${JSON.stringify(m)}`);
  assert.equal(d('on_upstream_error.agree') + d('on_upstream_error.disagree'), 0);
  assert.ok(d('price.disagree') > 0, 'its price is compared, not applied');
  const st = await admin.read('/plugins');
  assert.ok(st.shadow.disagreements.some((s) => /on_request: live model .*; shadow evil-shadow: reject 403 shadow_says_no/.test(s)),
    JSON.stringify(st.shadow.disagreements.slice(-3)));
  assert.ok(rt.gw.proc.lines.stderr.some((l) => /shadow plugin evil-shadow failed in on_upstream_error .*not affected: plugin budget exceeded/.test(l)));
});

test('a shadow setting is validated like any other: a bad mode is refused naming the field', async () => {
  const r = await admin.patch(`/groups/${group.id}`, { plugins: { 'evil-shadow': { mode: 'dark' } } });
  assert.equal(r.status, 400, r.text);
  assert.match(r.json.error.message, /plugins\.evil-shadow: mode: expected "live" or "shadow"/);
});
