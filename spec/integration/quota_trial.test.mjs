// A cooled account gets its half-open trial on the first request after its cooldown
// ends, with the shipped router plugin choosing. Two equal accounts a and b, the router
// plugin enabled; the mock answers one of a's requests with 429 and Retry-After: 2. The
// router's score of a drops with its error EWMA (0.2 after one failure, 8 × 0.2 below b
// at temperature 0.5: a ~4% draw), so before the fix the trial waited for the plugin to
// draw a — tens of seconds and hundreds of requests. Measured at the mock: after
// accounts.cooldown_until of a has passed, the very next request reaches a. Twice, so
// a lucky draw cannot pass it. The workbench part: a plugin's explicit exclusion still
// keeps the trial out, and `tollgate policy test` says which account was due its trial.
//
// One worker, so the account health (cooldown, half-open) is one state machine.

import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { REPO, TG_BIN, tempDir } from './lib/harness.mjs';
import { sleep, startRouting, statuses } from './lib/routing.mjs';

const RETRY_AFTER_S = 2;
let rt;

before(async () => {
  rt = await startRouting({
    accounts: [{ name: 'a' }, { name: 'b' }],
    routing: { cooldown_429_ms: 60000 },
    gateway: {
      workers: 1,
      plugins: { dirs: [path.join(REPO, 'plugins')], enabled: [{ name: 'router' }], watch: false },
    },
  });
});

after(() => rt?.stop());

async function coolThenTrial(round) {
  await rt.fault('a', { status: 429, retry_after: RETRY_AFTER_S, count: 1 });
  const start = (await rt.counts()).a;
  const rs = [];
  for (let i = 0; i < 200 && (await rt.counts()).a === start; i++) rs.push(await rt.chat(`round ${round} until a ${i} [mock chunks=1]`));
  assert.equal((await rt.counts()).a, start + 1, 'the router sent a request to a within 200');
  assert.deepEqual(statuses(rs), { 200: rs.length }, 'the 429 was retried on b');
  const row = await rt.account('a');
  assert.ok(row.cooldown_until_ms > row.now_ms, 'a is cooling');
  // Traffic while a cools: none of it reaches a.
  const during = [];
  while (Date.now() < row.cooldown_until_ms - 300) {
    during.push(await rt.chat(`round ${round} cooling [mock chunks=1]`));
    await sleep(50);
  }
  assert.equal((await rt.counts()).a, start + 1, `a got nothing while cooling (${during.length} requests)`);
  await sleep(Math.max(0, row.cooldown_until_ms - Date.now()) + 150);
  const r = await rt.chat(`round ${round} first after the cooldown [mock chunks=1]`);
  assert.equal(r.status, 200);
  const n = await rt.counts();
  assert.equal(n.a, start + 2, `the first request after a's cooldown was a's trial: ${JSON.stringify(n)}`);
}

test('with the router plugin, the first request after the cooldown is the cooled account\'s trial', async () => {
  await coolThenTrial(1);
  await coolThenTrial(2);
});

test('a plugin may still exclude the account due a trial, and the workbench shows both', () => {
  const dir = tempDir('trial-wb');
  fs.mkdirSync(path.join(dir, 'no-a'));
  fs.writeFileSync(path.join(dir, 'no-a', 'handler.lua'), `
local M = { name = "no-a", priority = 900, version = "1.0.0" }
function M.select_account(ctx, conf)
  for i = 1, ctx:naccounts() do
    if ctx:account(i).id == "a" then ctx:exclude(i) end
  end
end
return M
`);
  fs.writeFileSync(path.join(dir, 'no-a', 'schema.lua'), 'return { fields = {} }\n');
  const reqs = path.join(dir, 'reqs.jsonl');
  const accounts = [
    { id: 'b', error_ewma: 0 },
    { id: 'a', error_ewma: 0.2, trial: true },
  ];
  fs.writeFileSync(reqs, JSON.stringify({ id: 'r1', model: 'm', accounts }) + '\n');
  const run = (...args) => execFileSync(TG_BIN, ['policy', 'test', ...args, '--requests', reqs, '--dirs', path.join(REPO, 'plugins')], { encoding: 'utf8' });
  const withRouter = run(path.join(REPO, 'plugins', 'router'));
  assert.match(withRouter, /select_account +a \(due a trial\) +\[b [-0-9.]+, a trial [-0-9.]+\]/, withRouter);
  const excluding = run(path.join(dir, 'no-a'), '--with', 'router');
  assert.match(excluding, /select_account +b +\[b.*, a trial excluded\]/, excluding);
});
