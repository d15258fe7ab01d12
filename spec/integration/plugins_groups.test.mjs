// Plugins enabled and configured per group, against real Postgres and Redis and the
// mock upstream. Two groups share one account on the mock: group A enables model-map
// (alias-x → mock-y) and configures the `stamp` policy its own way, group B has no
// setting and runs the config file's list, group C turns `stamp` off. What the mock
// saw (its /_mock/last) and the headers the client got show which plugins ran with
// which config. A change through the admin API (or `tollgate apply`) is followed by
// the next requests, on every worker, without a restart; a config the plugin's schema
// refuses (wrong type, out of range, unknown plugin or field, hostile JSON) gets a 400
// naming the field, and the stored config keeps working.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { REPO, startMock, stopAll, tempDir, waitFor } from './lib/harness.mjs';
import { adminClient, applyState, chat, chatReq, createDb, plainKey, startStateGateway, stateFile, tool, toolConfig } from './lib/db.mjs';

const KEY_A = plainKey('ga');
const KEY_B = plainKey('gb');
const KEY_C = plainKey('gc');

// A policy whose effect is visible on the wire: a response header with its config value.
const STAMP = `return {
  name = "stamp", priority = 100, version = "1.0.0",
  schema = { fields = {
    value = { type = "string", default = "global", between = { 1, 32 } },
    times = { type = "integer", default = 1, between = { 1, 10 } },
  } },
  on_request = function(ctx, conf) ctx:add_header("x-stamp", conf.value .. "*" .. conf.times) end,
}
`;

let mock;
let db;
let gw;
let admin;
let plugins;
let groupA;

function groupsState(aPlugins) {
  return [
    { name: 'A', models: [], plugins: aPlugins },
    { name: 'B', models: [] },
    { name: 'C', models: [], plugins: { stamp: { enabled: false } } },
  ];
}

const A_FIRST = { 'model-map': { config: { aliases: { 'alias-x': 'mock-y' } } }, stamp: { config: { value: 'a' } } };

before(async () => {
  mock = await startMock();
  db = await createDb();
  const dir = tempDir('policies');
  fs.writeFileSync(path.join(dir, 'stamp.lua'), STAMP);
  // model-map is not in the config file's list: only group A enables it.
  plugins = { dirs: [path.join(REPO, 'plugins'), dir], enabled: [{ name: 'stamp' }], watch: false };
  await applyState(db, {
    tenants: [{ name: 'acme', balance: '100' }],
    groups: groupsState(A_FIRST),
    accounts: [{ name: 'up', provider: 'openai', base_url: `${mock.url}/v1`, credential: 'sk-groups', groups: ['A', 'B', 'C'] }],
    keys: [
      { name: 'ka', tenant: 'acme', group: 'A', key: KEY_A },
      { name: 'kb', tenant: 'acme', group: 'B', key: KEY_B },
      { name: 'kc', tenant: 'acme', group: 'C', key: KEY_C },
    ],
  }, { config: toolConfig({ plugins }) });
  gw = await startStateGateway(db, { plugins }, { mock });
  admin = adminClient(gw);
  groupA = (await admin.read('/groups')).data.find((g) => g.name === 'A');
});

after(async () => {
  await stopAll();
  await db?.drop();
});

/** One chat request on a fresh connection (so any worker); what the client and the mock saw. */
async function send(key, model = 'alias-x') {
  await mock.reset();
  const r = await chat(gw, key, chatReq(model));
  assert.equal(r.status, 200, r.text);
  const last = await mock.last();
  return { upstreamModel: JSON.parse(last.body).model, stamp: r.headers['x-stamp'] };
}

/** Waits until `n` requests in a row (fresh connections: both workers) satisfy ok. */
async function settles(key, ok, what, n = 8) {
  let streak = 0;
  let seen;
  await waitFor(async () => {
    seen = await send(key);
    streak = ok(seen) ? streak + 1 : 0;
    return streak >= n;
  }, { timeout: 10000, interval: 20, what: `${what} (last: ${JSON.stringify(seen)})` });
}

test('a key of group A runs A\'s plugins with A\'s config; B runs the config file\'s; C turns one off', async () => {
  await settles(KEY_A, (s) => s.upstreamModel === 'mock-y', 'group A maps alias-x to mock-y');
  for (let i = 0; i < 6; i++) {
    assert.deepEqual(await send(KEY_A), { upstreamModel: 'mock-y', stamp: 'a*1' }, 'A: model-map on, stamp with A\'s value and the default times');
    assert.deepEqual(await send(KEY_B), { upstreamModel: 'alias-x', stamp: 'global*1' }, 'B: no model-map, the config file\'s stamp');
    assert.deepEqual(await send(KEY_C), { upstreamModel: 'alias-x', stamp: undefined }, 'C: stamp turned off');
  }
});

test('a change through the admin API is followed by the next requests, without a restart', async () => {
  const upd = await admin.update(`/groups/${groupA.id}`, {
    plugins: { 'model-map': { config: { aliases: { 'alias-*': 'mock-*-z' } } }, stamp: { config: { value: 'a2', times: 3 } } },
  });
  assert.deepEqual(upd.plugins.stamp, { config: { value: 'a2', times: 3 } });
  await settles(KEY_A, (s) => s.upstreamModel === 'mock-x-z' && s.stamp === 'a2*3', 'group A follows its new config');
  assert.deepEqual(await send(KEY_B), { upstreamModel: 'alias-x', stamp: 'global*1' }, 'B is unaffected');
  // A plugin reload builds a new generation; the group's setting carries over.
  const rl = await admin.post('/plugins/reload');
  assert.equal(rl.status, 200, rl.text);
  await settles(KEY_A, (s) => s.upstreamModel === 'mock-x-z' && s.stamp === 'a2*3', 'group A after a plugin reload');
});

test('an invalid group config is refused with a 400 naming the field; the stored one keeps working', async () => {
  const before = await admin.read(`/groups/${groupA.id}`);
  const cases = [
    [{ 'model-map': { config: { aliases: 'alias-x' } } }, /plugins\.model-map\.config\.aliases: expected table, got string/],
    [{ 'model-map': { config: { aliases: { 'alias-x': 'y'.repeat(200) } } } }, /plugins\.model-map\.config\.aliases\["alias-x"\]: length must be between 1 and 127, got 200/],
    [{ stamp: { config: { times: 11 } } }, /plugins\.stamp\.config\.times: value must be between 1 and 10, got 11/],
    [{ stamp: { config: { times: 1.5 } } }, /plugins\.stamp\.config\.times: expected integer, got 1\.5/],
    [{ stamp: { config: { value: '' } } }, /plugins\.stamp\.config\.value: length must be between 1 and 32, got 0/],
    [{ stamp: { config: { valeu: 'x' } } }, /plugins\.stamp\.config\.valeu: unknown field/],
    [{ stamp: { config: { value: null } } }, /plugins\.stamp\.config\.value: null is not a value/],
    [{ stamp: { confg: {} } }, /plugins\.stamp: unknown key "confg" \(expected enabled, mode, sample, config\)/],
    [{ stamp: { enabled: 'yes' } }, /plugins\.stamp: enabled: expected true or false/],
    [{ stamp: true }, /plugins\.stamp: expected an object/],
    [{ 'no-such-plugin': {} }, /plugins\.no-such-plugin: not found/],
    [{ 'no-such-plugin': { enabled: false } }, /plugins\.no-such-plugin: not found/],
    [{ 'Bad Name': {} }, /plugins\.Bad Name: a plugin name holds only/],
  ];
  for (const [bad, re] of cases) {
    const r = await admin.patch(`/groups/${groupA.id}`, { plugins: bad });
    assert.equal(r.status, 400, `${JSON.stringify(bad)}: ${r.text}`);
    assert.equal(r.json?.error?.code, 'invalid_request', r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, re, JSON.stringify(bad));
    // Creating a group with it is refused the same way, and writes nothing.
    const c = await admin.post('/groups', { name: 'refused', plugins: bad });
    assert.equal(c.status, 400, c.text);
    assert.match(c.json.error.message, re);
  }
  assert.equal(await db.scalar("SELECT count(*) FROM groups WHERE name = 'refused'"), '0');
  assert.deepEqual(await admin.read(`/groups/${groupA.id}`), before, 'the stored config is unchanged');
  for (let i = 0; i < 4; i++) assert.deepEqual(await send(KEY_A), { upstreamModel: 'mock-x-z', stamp: 'a2*3' });
});

test('hostile plugin config JSON: huge and deeply nested bodies get a clear 400, the gateway keeps serving', async () => {
  const before = await admin.read(`/groups/${groupA.id}`);
  let deep = '"v"';
  for (let i = 0; i < 100; i++) deep = `[${deep}]`;
  let deeper = '1';
  for (let i = 0; i < 50000; i++) deeper = `[${deeper}]`;
  const aliases = {};
  for (let i = 0; i < 20000; i++) aliases[`model-${i}`] = `target-${i}`;
  const cases = [
    [`{"plugins":{"stamp":{"config":{"value":${deep}}}}}`, /plugins\.stamp\.config\.value(\[1\])+: nested too deeply/],
    [`{"plugins":{"stamp":{"config":{"value":${deeper}}}}}`, /not valid JSON|too deep|depth/i],
    [JSON.stringify({ plugins: { 'model-map': { config: { aliases } } } }), /plugins\.model-map\.config.*too large/],
  ];
  for (const [body, re] of cases) {
    const r = await admin.call('PATCH', `/groups/${groupA.id}`, body, { headers: { 'content-type': 'application/json' } });
    assert.ok(r.status === 400 || r.status === 413, `${body.length} bytes: ${r.status} ${r.text.slice(0, 300)}`);
    assert.equal(typeof r.json?.error?.message, 'string', r.text.slice(0, 300));
    if (r.status === 400) assert.match(r.json.error.message, re);
  }
  assert.deepEqual(await admin.read(`/groups/${groupA.id}`), before);
  assert.deepEqual(await send(KEY_A), { upstreamModel: 'mock-x-z', stamp: 'a2*3' });
});

test('tollgate apply validates group configs the same way and refuses with one clear line', async () => {
  const cfg = toolConfig({ plugins });
  const state = (aPlugins) => ({ groups: groupsState(aPlugins) });
  const bad = await tool(['apply', stateFile(state({ stamp: { config: { times: 0 } } }))], { db, config: cfg });
  assert.notEqual(bad.code, 0);
  assert.equal(bad.stderr.trim().split('\n').length, 1, bad.stderr);
  assert.match(bad.stderr, /^apply: groups\[1\]: plugins\.stamp\.config\.times: value must be between 1 and 10, got 0$/m);
  const unknown = await tool(['apply', stateFile(state({ 'nope-plugin': {} }))], { db, config: cfg });
  assert.notEqual(unknown.code, 0);
  assert.match(unknown.stderr, /apply: groups\[1\]: plugins\.nope-plugin: not found/);
  assert.deepEqual(await send(KEY_A), { upstreamModel: 'mock-x-z', stamp: 'a2*3' }, 'nothing changed');

  // A valid one is written and followed at once (apply publishes the invalidation).
  const ok = await tool(['apply', stateFile(state(A_FIRST))], { db, config: cfg });
  assert.equal(ok.code, 0, ok.stderr);
  assert.match(ok.stdout, /~ groups A: plugins/);
  await settles(KEY_A, (s) => s.upstreamModel === 'mock-y' && s.stamp === 'a*1', 'group A back to its first config');
});
