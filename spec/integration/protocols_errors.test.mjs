// Errors the gateway itself answers (not the upstream's) reach each client in its own
// protocol's shape, with the headers that go with them: a rate-limit refusal from
// admission carries Retry-After and is, for an Anthropic client, Anthropic's
// {"type":"error","error":{"type":"rate_limit_error",...}} that the official SDK turns
// into its RateLimitError; the same refusal on /v1/chat/completions stays OpenAI's shape.
// A wrong method on /v1/messages is a 405 with Allow, in Anthropic's shape too.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { stopAll, startMock } from './lib/harness.mjs';
import { applyState, createDb, plainKey, startStateGateway } from './lib/db.mjs';

const KEY = plainKey('errors');
let db;
let mock;
let gw;

before(async () => {
  mock = await startMock();
  db = await createDb();
  await applyState(db, {
    tenants: [{ name: 't' }],
    groups: [{ name: 'g' }],
    accounts: [{ name: 'a', provider: 'anthropic', base_url: `${mock.url}/v1`, credential: 'sk-errors', concurrency: 100, groups: ['g'] }],
    keys: [{ name: 'errors', tenant: 't', group: 'g', key: KEY, rpm: 60 }],
  });
  // A bucket of one: the first request is admitted, the next ones refused for ~1 s.
  await db.exec("UPDATE api_keys SET rpm_burst = 1 WHERE name = 'errors'");
  gw = await startStateGateway(db, {}, { mock });
});

after(async () => {
  await stopAll();
  await db?.drop();
});

test('admission 429 in Anthropic shape reaches the Anthropic SDK as RateLimitError, with Retry-After', async () => {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const client = new Anthropic({ apiKey: KEY, baseURL: gw.url, maxRetries: 0 });
  const req = { model: 'mock-claude', max_tokens: 16, messages: [{ role: 'user', content: 'hi [mock chunks=1]' }] };
  const first = await client.messages.create(req);
  assert.equal(first.type, 'message');
  let seen;
  await assert.rejects(client.messages.create(req), (e) => {
    seen = e;
    return e instanceof Anthropic.RateLimitError;
  });
  assert.equal(seen.status, 429);
  assert.equal(seen.error?.type, 'error');
  assert.equal(seen.error?.error?.type, 'rate_limit_error');
  assert.match(seen.error?.error?.message ?? '', /limit reached/);
  assert.ok(Number(seen.headers?.get?.('retry-after') ?? seen.headers?.['retry-after']) >= 1, 'Retry-After on the refusal');
});

test('the same refusal on chat completions is OpenAI-shaped', async () => {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mock-claude', messages: [{ role: 'user', content: 'x' }] }),
  });
  // Earlier requests emptied the bucket of one: refused until it refills.
  assert.equal(res.status, 429);
  assert.ok(Number(res.headers.get('retry-after')) >= 1);
  const body = await res.json();
  assert.equal(body.error.type, 'rate_limit_error');
  assert.equal(body.error.code, 'rate_limit_exceeded');
  assert.equal(body.type, undefined);
});

test('a wrong method on /v1/messages: 405 with Allow, in Anthropic shape', async () => {
  const res = await fetch(`${gw.url}/v1/messages`, { method: 'PUT', headers: { 'x-api-key': KEY } });
  assert.equal(res.status, 405);
  assert.equal(res.headers.get('allow'), 'POST');
  const body = await res.json();
  assert.ok(body.error, JSON.stringify(body));
});
