// The capture (plugins.capture) and its replay: under load every sampled request's line
// reaches the file (none lost), the per-second cap holds, no credential is recorded, the
// admin API serves the file, and `tollgate policy test --compare` replaying the capture
// through the live policy (the router, whose draws are random) reproduces every
// recorded decision exactly — while a different candidate, or the same lines without
// their seeds, shows differences.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { ADMIN_TOKEN, REPO, TG_BIN, fetchT, tempDir, waitFor } from './lib/harness.mjs';
import { sendMany, startRouting, statuses } from './lib/routing.mjs';

const ROUTER_CONF = '{top_k = 3, temperature = 2}';
let rt;
let file;
const CAP = 25;

before(async () => {
  file = path.join(tempDir('capture'), 'sub', 'capture.jsonl');
  rt = await startRouting({
    accounts: [{ name: 'a' }, { name: 'b' }, { name: 'c' }, { name: 'd' }],
    routing: { cooldown_5xx_ms: 60000 },
    gateway: {
      plugins: {
        dirs: [path.join(REPO, 'plugins'), path.join(REPO, 'policies')],
        watch: false,
        enabled: [{ name: 'router', config: { top_k: 3, temperature: 2 } }],
        capture: { rate: 1, max_per_s: CAP, file, headers: ['x-tier', 'user-agent'] },
      },
    },
  });
});

after(() => rt?.stop());

const admin = async (p) => {
  const r = await fetchT(`${rt.gw.url}/admin/api/v1/plugins/capture${p}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  return { status: r.status, type: r.headers.get('content-type'), text: await r.text() };
};

const status = async () => JSON.parse((await admin('')).text);

function policyTest(args) {
  // Run from a folder that is not the repository: the default plugin folders are the
  // install's, not the working directory's.
  const r = spawnSync(TG_BIN, ['policy', 'test', ...args], { cwd: tempDir('cwd'), encoding: 'utf8', timeout: 60000, maxBuffer: 64 << 20 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

let lines;

test('under load every sampled request is written, the cap holds, no credential is kept', async () => {
  const s0 = await status();
  assert.equal(s0.enabled, true);
  // Accounts a and b fail: a request that tries one first is retried on another (two
  // or three attempts, never more than max_attempts). The first requests go one at a
  // time, so some surely meet a failing account before it cools down.
  await rt.fault('a', { status: 500 });
  await rt.fault('b', { status: 500 });
  const t0 = Date.now();
  const make = (i) => [`load ${i} [mock chunks=2]`, {}, { headers: { 'x-tier': 'gold', 'x-secret-thing': 'nope' } }];
  const first = await sendMany(rt, 10, make, { concurrency: 1 });
  const rs = first.concat(await sendMany(rt, 230, (i) => make(i + 10), { concurrency: 24 }));
  const secs = (Date.now() - t0) / 1000;
  assert.deepEqual(statuses(rs), { 200: 240 });
  const s = await waitFor(async () => {
    const x = await status();
    return x.pending === 0 && x.sampled === x.written ? x : null;
  }, { timeout: 10000, what: 'the capture to drain' });
  const sampled = s.sampled - s0.sampled;
  assert.ok(sampled > 0, 'something was sampled');
  assert.ok(sampled <= CAP * (Math.ceil(secs) + 2), `${sampled} sampled in ${secs.toFixed(1)} s is within ${CAP}/s`);
  assert.ok(s.skipped_cap > 0, `the cap turned requests away (${JSON.stringify(s)})`);
  assert.equal(s.write_errors, 0);
  const text = fs.readFileSync(file, 'utf8');
  lines = text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
  assert.equal(lines.length, s.written, 'one line per written request');
  // The warm-up requests of startRouting were recorded too; the load's are these.
  const load = lines.filter((l) => l.headers['x-tier'] === 'gold');
  assert.equal(load.length, sampled, 'every sampled request of the load has its line');
  assert.ok(!text.includes(rt.key), 'the client key is never recorded');
  assert.ok(!/authorization|x-secret-thing/i.test(text), 'only allow-listed headers are recorded');
  for (const l of load) {
    assert.equal(l.capture, 1);
    assert.equal(l.outcome.status, 200);
    assert.ok(l.attempts.length >= 1 && l.attempts[0].accounts.length >= 1, JSON.stringify(l));
    assert.equal(l.live.select.length, l.attempts.length);
    assert.ok(Number.isInteger(l.seed));
    assert.equal(l.outcome.account, l.live.select.at(-1).account);
  }
  assert.ok(lines.some((l) => l.attempts.length > 1 && l.attempts[0].upstream_error?.status === 500),
    'a retried request records both attempts and the error between them');
  // The admin API serves the same lines.
  const dl = await admin('/download');
  assert.equal(dl.status, 200);
  assert.match(dl.type, /ndjson/);
  assert.equal(dl.text, text);
});

test('replaying the capture through the live policy reproduces every decision', () => {
  assert.ok(lines?.length, 'the capture test ran');
  const r = policyTest(['router', '--config', ROUTER_CONF, '--requests', file, '--compare', '--json']);
  assert.equal(r.code, 0, r.stderr);
  const rep = JSON.parse(r.stdout);
  assert.equal(rep.requests, lines.length);
  assert.equal(rep.compared, lines.length);
  assert.equal(rep.differ, 0, JSON.stringify(rep.diffs.slice(0, 5)));
  assert.equal(rep.plugin_errors, 0);
  // The text report says the same in words.
  const t = policyTest(['router', '--config', ROUTER_CONF, '--requests', file, '--compare']);
  assert.equal(t.code, 0, t.stderr);
  assert.match(t.stdout, new RegExp(`${lines.length} compared with their live decisions: 0 differ`));
});

test('a different candidate, or the lines without their seeds, differ — and say how', () => {
  const greedy = policyTest(['router', '--config', '{top_k = 1}', '--requests', file, '--compare', '--json', '--fail-on-diff']);
  assert.equal(greedy.code, 3, greedy.stderr);
  const rep = JSON.parse(greedy.stdout);
  assert.ok(rep.differ > 0);
  assert.equal(rep.differences_by_hook.select_account, rep.diffs.filter((d) => d.hook === 'select_account').length);
  const d = rep.diffs[0];
  assert.match(d.live, /^[abcd] \(cost [\d.]+, TTFT EWMA/);
  assert.match(d.why, /scores/);
  assert.ok(rep.mean_choice_cost.live > 0 && rep.mean_choice_cost.candidate > 0);
  // Without the seeds the same policy draws other numbers: the seed is what makes the
  // replay exact.
  const unseeded = path.join(tempDir('unseeded'), 'c.jsonl');
  fs.writeFileSync(unseeded, lines.map(({ seed, ...l }) => JSON.stringify(l)).join('\n') + '\n');
  const u = policyTest(['router', '--config', ROUTER_CONF, '--requests', unseeded, '--compare', '--json']);
  assert.equal(u.code, 0, u.stderr);
  assert.ok(JSON.parse(u.stdout).differ > 0, 'unseeded draws differ');
});

test('a download right after a request has its line: the writer batches lines, but a reader has the queue written first', async () => {
  await new Promise((r) => setTimeout(r, 1100)); // a fresh second of the cap
  for (let i = 0; i < 6; i++) {
    const tier = `flush-${i}-${Date.now()}`;
    const rs = await sendMany(rt, 1, () => [`flush ${i} [mock chunks=2]`, {}, { headers: { 'x-tier': tier } }]);
    assert.deepEqual(statuses(rs), { 200: 1 });
    // No wait: the line was queued when the response ended; the writer would hold it
    // for up to 50 ms more for company.
    const dl = await admin('/download');
    assert.equal(dl.status, 200);
    const mine = dl.text.split('\n').filter(Boolean).map((l) => JSON.parse(l)).filter((l) => l.headers['x-tier'] === tier);
    assert.equal(mine.length, 1, `request ${i}: its line is in the download at once`);
  }
});
