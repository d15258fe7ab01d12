// Plugin refusals and plugin runtime failures (issue "hostile", items 13 and 14):
//
// - a plugin's reject on /v1/messages is an Anthropic error ({"type":"error","error":
//   {"type":...,"message":...}}) that the @anthropic-ai/sdk client parses; on
//   /v1/chat/completions and /v1/responses it is OpenAI's shape; so are a fail_closed
//   plugin's 500 and the gateway's own auth refusals;
// - a gateway whose worker cannot build its plugin runtime does not start (it never
//   serves with no policy at all): it exits 2 naming the cause.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';

import {
  CLIENT_KEY, HOST, Proc, chatBody, fetchT, freePort, postJson, startGateway, startMock, stopAll, tempDir, toLua,
} from './lib/harness.mjs';

const POLICY = `
return {
  name = "gatekeeper", priority = 10, version = "1", fail_closed = true,
  on_request = function(ctx)
    if ctx:header("x-block") then return ctx:reject(403, "blocked_by_policy", "tenant \\"x\\" is blocked") end
    if ctx:header("x-slow-down") then return ctx:reject(429, "too_fast", "slow down") end
    if ctx:header("x-odd-code") then return ctx:reject(400, 'bad"code\\\\x', "odd code") end
    if ctx:header("x-boom") then error("policy crashed") end
  end,
}
`;

let mock;
let gw;

before(async () => {
  const dir = tempDir('policies');
  fs.writeFileSync(path.join(dir, 'gatekeeper.lua'), POLICY);
  mock = await startMock();
  gw = await startGateway({ plugins: { dirs: [dir], enabled: [{ name: 'gatekeeper' }] } }, { mock });
});

after(() => stopAll());

const messagesBody = { model: 'mock-claude', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }] };

function assertAnthropicShape(r, status, type) {
  assert.equal(r.status, status, r.text);
  assert.match(r.headers.get('content-type') ?? '', /^application\/json/);
  assert.equal(r.json?.type, 'error', r.text);
  assert.equal(r.json.error?.type, type, r.text);
  assert.equal(typeof r.json.error.message, 'string');
  assert.deepEqual(Object.keys(r.json).sort(), ['error', 'type']);
}

function assertOpenAIShape(r, status, code) {
  assert.equal(r.status, status, r.text);
  assert.equal(r.json?.type, undefined, r.text);
  assert.equal(typeof r.json?.error?.message, 'string', r.text);
  assert.equal(typeof r.json.error.type, 'string');
  assert.equal(r.json.error.code, code, r.text);
}

test('a plugin reject on /v1/messages is an Anthropic error (raw bytes)', async () => {
  const r = await postJson(gw.url, '/v1/messages', messagesBody, { headers: { 'x-block': '1' } });
  assertAnthropicShape(r, 403, 'permission_error');
  assert.equal(r.json.error.message, 'tenant "x" is blocked');
  const slow = await postJson(gw.url, '/v1/messages', messagesBody, { headers: { 'x-slow-down': '1' } });
  assertAnthropicShape(slow, 429, 'rate_limit_error');
  // The plugin's code is its own text: the body stays valid JSON whatever it holds.
  const odd = await postJson(gw.url, '/v1/messages', messagesBody, { headers: { 'x-odd-code': '1' } });
  assertAnthropicShape(odd, 400, 'invalid_request_error');
  const oddChat = await postJson(gw.baseURL, '/chat/completions', chatBody('hi'), { headers: { 'x-odd-code': '1' } });
  assertOpenAIShape(oddChat, 400, 'bad_code_x');
  assert.equal((await mock.stats()).total, 0, 'a rejected request reached the upstream');
});

test('a fail_closed plugin that crashes answers 500 in each route\'s own shape', async () => {
  const m = await postJson(gw.url, '/v1/messages', messagesBody, { headers: { 'x-boom': '1' } });
  assert.equal(m.status, 500, m.text);
  assert.equal(m.json?.type, 'error', m.text);
  assert.equal(typeof m.json.error?.type, 'string');
  const c = await postJson(gw.baseURL, '/chat/completions', chatBody('hi'), { headers: { 'x-boom': '1' } });
  assert.equal(c.status, 500, c.text);
  assert.equal(c.json?.type, undefined);
  assert.equal(typeof c.json?.error?.message, 'string');
});

test('the @anthropic-ai/sdk client parses a plugin refusal', async () => {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const client = new Anthropic({
    apiKey: CLIENT_KEY, baseURL: gw.url, maxRetries: 0, timeout: 15000, defaultHeaders: { 'x-block': '1' },
  });
  await assert.rejects(client.messages.create(messagesBody), (e) => {
    assert.ok(e instanceof Anthropic.PermissionDeniedError, `got ${e?.constructor?.name}: ${e?.message}`);
    assert.equal(e.status, 403);
    assert.equal(e.error?.type, 'error');
    assert.equal(e.error?.error?.type, 'permission_error');
    assert.equal(e.error?.error?.message, 'tenant "x" is blocked');
    return true;
  });
  const limited = new Anthropic({
    apiKey: CLIENT_KEY, baseURL: gw.url, maxRetries: 0, timeout: 15000, defaultHeaders: { 'x-slow-down': '1' },
  });
  await assert.rejects(limited.messages.create(messagesBody), (e) => {
    assert.ok(e instanceof Anthropic.RateLimitError, `got ${e?.constructor?.name}`);
    assert.equal(e.error?.error?.type, 'rate_limit_error');
    return true;
  });
});

test('the same reject on /v1/chat/completions and /v1/responses is an OpenAI error', async () => {
  const c = await postJson(gw.baseURL, '/chat/completions', chatBody('hi'), { headers: { 'x-block': '1' } });
  assertOpenAIShape(c, 403, 'blocked_by_policy');
  const r = await postJson(gw.baseURL, '/responses', { model: 'gpt-4o-mini', input: 'hi' }, { headers: { 'x-block': '1' } });
  assertOpenAIShape(r, 403, 'blocked_by_policy');
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ apiKey: CLIENT_KEY, baseURL: gw.baseURL, maxRetries: 0, defaultHeaders: { 'x-block': '1' } });
  await assert.rejects(client.chat.completions.create(chatBody('hi')), (e) => {
    assert.ok(e instanceof OpenAI.PermissionDeniedError, `got ${e?.constructor?.name}`);
    assert.equal(e.code, 'blocked_by_policy');
    return true;
  });
});

test('auth refusals follow the route: Anthropic on /v1/messages, OpenAI elsewhere', async () => {
  const m = await postJson(gw.url, '/v1/messages', messagesBody, { key: 'wrong-key' });
  assertAnthropicShape(m, 401, 'authentication_error');
  const none = await postJson(gw.url, '/v1/messages', messagesBody, { key: null });
  assertAnthropicShape(none, 401, 'authentication_error');
  const c = await postJson(gw.baseURL, '/chat/completions', chatBody('hi'), { key: 'wrong-key' });
  assertOpenAIShape(c, 401, 'invalid_api_key');
});

// Builds twice: the first Lua state that loads it (the startup check) starts before one
// second of the process's CPU time and spends up to 1.1 s, the second (worker 0's) up to
// 1.6 s; every later build (worker 1's) starts after 1.5 s and fails, the way a plugin
// whose load depends on its surroundings does. So worker 0 is built and must be undone.
const FRAGILE = `
local c = os.clock()
if c >= 1.5 then error("cannot be built after the second load") end
local stop = c >= 1.0 and 1.6 or 1.1
while os.clock() < stop do end
return {
  name = "fragile", priority = 1, version = "1", fail_closed = true,
  on_request = function(ctx)
    return ctx:reject(403, "always_blocked", "nothing passes this policy")
  end,
}
`;

test('a worker whose plugin runtime cannot be built stops the gateway from starting', async () => {
  const dir = tempDir('fragile');
  fs.writeFileSync(path.join(dir, 'fragile.lua'), FRAGILE);
  const port = await freePort();
  const config = {
    listen: `${HOST}:${port}`,
    workers: 2,
    keys: [CLIENT_KEY],
    upstream: { url: `${mock.url}/v1`, api_key: 'sk-upstream-1' },
    plugins: { dirs: [dir], enabled: [{ name: 'fragile' }], max_hook_ms: 1000, watch: true },
  };
  const cfgPath = path.join(dir, 'tollgate.lua');
  fs.writeFileSync(cfgPath, `return ${toLua(config)}\n`);
  const proc = new Proc('gateway-fragile', ['serve', '-c', cfgPath], { env: { TOLLGATE_PG: null, TOLLGATE_REDIS: null } });
  // It must never answer a request: were it serving, this request would pass unchecked.
  let served = null;
  const probe = (async () => {
    while (proc.running && served === null) {
      try {
        const r = await fetchT(`http://${HOST}:${port}/v1/chat/completions`, {
          method: 'POST',
          headers: { authorization: `Bearer ${CLIENT_KEY}`, 'content-type': 'application/json' },
          body: JSON.stringify(chatBody('hi')),
        }, 1000);
        served = r.status;
      } catch {
        await new Promise((res) => setTimeout(res, 50));
      }
    }
  })();
  const exit = await Promise.race([proc.exited, new Promise((res) => setTimeout(() => res('timeout'), 15000))]);
  await proc.stop();
  await probe;
  assert.notEqual(exit, 'timeout', `the gateway kept running (a request got ${served})\n${proc.tail()}`);
  assert.equal(served, null, `a request was answered ${served}`);
  assert.equal(exit.code, 2, proc.tail());
  await proc.closed;
  const text = proc.lines.stderr.join('\n');
  assert.match(text, /worker 1: the plugin runtime could not be built/, proc.tail());
  assert.match(text, /plugins\.fragile: .*cannot be built after the second load/, proc.tail());
});
