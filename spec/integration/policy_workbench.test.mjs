// The policy workbench's admin API across two gateway instances that share Postgres and
// Redis (each with its own store folder, no shared disk): a policy uploaded on one is
// written and loaded by the other; a replay of the capture shows where it differs from
// the live decisions; shadow for a group decides nothing (counted, the mock sees the
// live choice); promote makes it decide for the group, then for every request; rollback
// restores the generation before; every change is in the audit list with who made it
// and its generation. Hostile uploads are refused with a clear message and store nothing.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { REPO, tempDir, waitFor } from './lib/harness.mjs';
import { adminClient } from './lib/db.mjs';
import { sendMany, startRouting, statuses } from './lib/routing.mjs';

const pick = (id, version = '1.0.0') => `return {
  name = "pick-one", priority = 800, version = "${version}",
  schema = { fields = { id = { type = "string", default = "${id}" } } },
  select_account = function(ctx, conf)
    for i = 1, ctx:naccounts() do
      if ctx:account(i).id == conf.id then return ctx:select(i) end
    end
  end,
}
`;

let rt;
let gwB;
let A;
let B;
let storeA;
let storeB;
let groups;

const pluginsConfig = (store) => ({
  dirs: [path.join(REPO, 'plugins')],
  store,
  watch: false,
  max_hook_ms: 50,
  enabled: [],
  capture: { rate: 1, max_per_s: 1000, file: path.join(tempDir('capture'), 'capture.jsonl') },
});

before(async () => {
  storeA = path.join(tempDir('storeA'), 'policies');
  storeB = path.join(tempDir('storeB'), 'policies');
  rt = await startRouting({
    accounts: [{ name: 'a', groups: ['pool', 'other'] }, { name: 'b', groups: ['pool', 'other'] }, { name: 'c', groups: ['pool', 'other'] }],
    groups: ['pool', 'other'],
    gateway: { plugins: pluginsConfig(storeA) },
  });
  gwB = await rt.another({ plugins: pluginsConfig(storeB) });
  A = adminClient(rt.gw, { headers: {} });
  B = adminClient(gwB);
  groups = Object.fromEntries((await A.read('/groups')).data.map((g) => [g.name, g.id]));
});
after(() => rt?.stop());

const as = (who) => ({ headers: { 'x-tollgate-actor': who } });

/** Requests of group `grp` through gateway g: every one must answer 200. */
async function load(g, grp, n = 12) {
  const rs = await sendMany(rt, n, () => ['hello [mock chunks=1]', {}, { gw: g, key: rt.keys[grp] }], { concurrency: 3 });
  assert.deepEqual(statuses(rs), { 200: n });
}

async function countsOf(g, grp, n = 12) {
  await rt.mock.reset();
  await load(g, grp, n);
  return rt.counts();
}

test('hostile or broken uploads are refused, each with a clear message, and nothing is stored', async () => {
  const dir = tempDir('bc');
  fs.writeFileSync(path.join(dir, 'bc.lua'), 'return { name = "bc", priority = 1, version = "1" }');
  const bc = execFileSync('luajit', ['-b', path.join(dir, 'bc.lua'), '-']).toString('latin1');
  const wrap = (name, body, top = '') => `${top}\nreturn {\n  name = "${name}", priority = 1, version = "1",\n${body}\n}\n`;
  const cases = [
    ['syntax', wrap('syntax', 'on_request = function(ctx)\n    if then end\n  end,'), /syntax\.lua:5: unexpected symbol near 'then'/],
    ['loop', wrap('loop', 'on_request = function(ctx) while true do end end,'), /plugin budget exceeded: ran longer than 50 ms/],
    ['huge', `-- ${'x'.repeat(300 * 1024)}\n${wrap('huge', '')}`, /^source: 30\d+ bytes, over the limit of 262144$/],
    ['bc', bc, /^source: bytecode is not accepted/],
    ['io', wrap('io', '', 'local f = io.open("/etc/passwd")'), /attempt to index global 'io' \(a nil value\)/],
    ['os', wrap('os', 'on_request = function(ctx) os.execute("touch /tmp/tg-pwned") end,'), /attempt to call field 'execute'/],
    ['ffi', wrap('ffi', '', 'local ffi = require("ffi")'), /require\('ffi'\) is not allowed/],
    ['dbg', wrap('dbg', '', 'local d = debug.getinfo(1)'), /attempt to index global 'debug'/],
    ['ld', wrap('ld', '', 'local f = load("return 1")'), /attempt to call global 'load' \(a nil value\)/],
  ];
  for (const [name, source, re] of cases) {
    const r = await A.call('PUT', `/policies/${name}`, { source });
    assert.equal(r.status, 422, `${name}: ${r.status} ${r.text.slice(0, 200)}`);
    assert.equal(r.json.error.code, 'policy_invalid', name);
    assert.match(r.json.error.message, re, name);
    assert.equal((await A.get(`/policies/${name}`)).status, 404, name);
  }
  assert.ok(!fs.existsSync('/tmp/tg-pwned'));
  // A shipped plugin is read-only here; its source is readable.
  const ro = await A.call('PUT', '/policies/router', { source: pick('a') });
  assert.equal(ro.status, 409);
  assert.equal(ro.json.error.code, 'read_only');
  const router = await A.read('/policies/router');
  assert.equal(router.shipped, true);
  assert.match(router.source, /select_account/);
  assert.deepEqual(await A.read('/policy-audit'), { data: [] });
});

test('upload, replay, shadow, promote for a group then all, roll back: on both instances, audited', async () => {
  // Live decisions to replay against: the built-in pick, captured on A.
  const live = await countsOf(rt.gw, 'pool', 12);
  const target = Object.keys(live).find((k) => live[k] < 12);

  // Upload on A: stored, written to B's own folder and loaded there.
  const up = await A.call('PUT', '/policies/pick-one', { source: pick('zz'), config: { id: target } }, as('alice'));
  assert.equal(up.status, 200, up.text);
  assert.equal(up.json.generation, 1);
  assert.deepEqual(up.json.deployed, { groups: {}, all: false });
  assert.equal(fs.readFileSync(path.join(storeA, 'pick-one.lua'), 'utf8'), pick('zz'));
  await waitFor(() => fs.existsSync(path.join(storeB, 'pick-one.lua')), { timeout: 8000, what: 'B to write pick-one.lua' });
  const listed = (await B.read('/policies')).data.find((p) => p.name === 'pick-one');
  assert.equal(listed.kind, 'stored');
  assert.equal(listed.generation, 1);
  // Uploading the same again changes nothing.
  assert.equal((await B.call('PUT', '/policies/pick-one', { source: pick('zz'), config: { id: target } })).status, 409);

  // Replay on A against its capture: the candidate picks `target` where the live pick did not.
  const rep = await A.post('/policies/pick-one/replay', {});
  assert.equal(rep.status, 200, rep.text);
  assert.ok(rep.json.compared >= 12, rep.text.slice(0, 300));
  // (the capture also holds the warm-up requests of the start)
  assert.ok(rep.json.differ >= 12 - live[target] && rep.json.differ < rep.json.compared, rep.text.slice(0, 300));
  assert.equal(rep.json.differences_by_hook.select_account, rep.json.differ);
  assert.match(rep.json.diffs[0].candidate, new RegExp(`^${target}`));

  // Shadow for `pool`, made on B: A runs it on pool's requests and applies nothing.
  const sh = await B.post('/policies/pick-one/shadow', { group_id: groups.pool }, as('bob'));
  assert.equal(sh.status, 200, sh.text);
  assert.equal(sh.json.generation, 2);
  const shadowSeen = async () => {
    const st = await A.read('/plugins');
    const h = st.shadow.hooks.select_account;
    return h.agree + h.disagree;
  };
  await waitFor(async () => {
    await load(rt.gw, 'pool', 3);
    return (await shadowSeen()) > 0;
  }, { timeout: 8000, what: 'A to run the shadow' });
  const before = await shadowSeen();
  const shadowCounts = await countsOf(rt.gw, 'pool', 12);
  assert.ok(Object.values(shadowCounts).filter((n) => n > 0).length >= 1);
  assert.ok((await shadowSeen()) >= before + 12);
  assert.notEqual(shadowCounts[target], 12, 'the shadow decided nothing');

  // Promote for `pool`, made on A: B's requests of pool all go to target; other's do not.
  const pr = await A.post('/policies/pick-one/promote', { group_id: groups.pool }, as('alice'));
  assert.equal(pr.status, 200, pr.text);
  assert.deepEqual(pr.json.deployed, { groups: { [groups.pool]: { mode: 'live' } }, all: false });
  await waitFor(async () => (await countsOf(gwB, 'pool', 6))[target] === 6, { timeout: 8000, what: 'B to run it live for pool' });
  assert.equal((await countsOf(gwB, 'pool', 12))[target], 12);
  const group = await B.read(`/groups/${groups.pool}`);
  assert.deepEqual(group.plugins['pick-one'], { config: { id: target } });

  // Promote for all, made on B: A's requests of `other` follow it too.
  const all = await B.post('/policies/pick-one/promote', {}, as('bob'));
  assert.equal(all.status, 200, all.text);
  assert.equal(all.json.deployed.all, true);
  await waitFor(async () => (await countsOf(rt.gw, 'other', 6))[target] === 6, { timeout: 8000, what: 'A to run it for all' });
  assert.deepEqual((await B.read(`/groups/${groups.pool}`)).plugins, {});

  // Roll back, on A: generation 5 is generation 3 again (live for pool only), on B too.
  const rb = await A.post('/policies/pick-one/rollback', {}, as('carol'));
  assert.equal(rb.status, 200, rb.text);
  assert.equal(rb.json.generation, 5);
  assert.deepEqual(rb.json.deployed, { groups: { [groups.pool]: { mode: 'live' } }, all: false });
  await waitFor(async () => (await countsOf(gwB, 'other', 12))[target] < 12, { timeout: 8000, what: 'B to stop running it for other' });
  assert.equal((await countsOf(gwB, 'pool', 12))[target], 12);

  // An edit is a new generation: B loads the new source (its generation moves on).
  const genB = (await B.read('/plugins')).generation;
  const ed = await B.call('PUT', '/policies/pick-one', { source: pick('zz', '1.1.0'), config: { id: target } }, as('bob'));
  assert.equal(ed.status, 200, ed.text);
  assert.equal(ed.json.generation, 6);
  await waitFor(async () => fs.readFileSync(path.join(storeA, 'pick-one.lua'), 'utf8') === pick('zz', '1.1.0'),
    { timeout: 8000, what: 'A to write the edit' });
  assert.ok((await B.read('/plugins')).generation > genB);
  const got = await A.read('/policies/pick-one');
  assert.equal(got.generation, 6);
  assert.equal(got.source, pick('zz', '1.1.0'));
  assert.deepEqual(got.generations.map((g) => g.generation), [6, 5, 4, 3, 2, 1]);

  // The audit list, on either instance: who, what, which generation.
  const audit = (await B.read('/policy-audit?name=pick-one')).data;
  assert.deepEqual(audit.map((a) => [a.action, a.generation, a.actor.split(' ')[0]]), [
    ['upload', 6, 'bob'], ['rollback', 5, 'carol'], ['promote', 4, 'bob'], ['promote', 3, 'alice'],
    ['shadow', 2, 'bob'], ['upload', 1, 'alice'],
  ]);
  assert.match(audit[1].detail, /back to generation 3/);
  assert.match(audit[3].detail, /live for group \d+ \(pool\)/);
  assert.match(audit[5].actor, /^alice \(API token, 127\.0\.0\.1\)$/);

  // Refusals that keep a router safe: for-all before any group, shadow of a live-for-all.
  const up2 = await A.call('PUT', '/policies/pick-two', { source: pick('zz').replace('pick-one', 'pick-two') });
  assert.equal(up2.status, 200, up2.text);
  const early = await A.post('/policies/pick-two/promote', {});
  assert.equal(early.status, 409);
  assert.match(early.json.error.message, /promote pick-two live for a group first/);
  const nogroup = await A.post('/policies/pick-two/shadow', { group_id: 987654321 });
  assert.equal(nogroup.status, 404);
  const none = await A.post('/policies/nope/rollback', {});
  assert.equal(none.status, 404);
});
