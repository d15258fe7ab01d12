// The official SDKs against the real gateway, with upstreams of both kinds (the mock
// speaks OpenAI chat and Anthropic Messages): each client protocol served by an account of
// its own protocol and of the other, streaming and not. What a user notices: the text the
// SDK assembles, the stop reason, the usage numbers, the error class, and what the
// upstream saw (its protocol's path and credential header).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { CLIENT_KEY, UPSTREAM_KEY, mockText, startGateway, startMock, stopAll } from './lib/harness.mjs';

let mock;
let gwOpenAI; // static upstream speaking OpenAI chat
let gwAnthropic; // static upstream speaking Anthropic Messages

before(async () => {
  mock = await startMock();
  gwOpenAI = await startGateway({}, { mock });
  gwAnthropic = await startGateway({ upstream: { provider: 'anthropic' } }, { mock });
});

after(async () => {
  await stopAll();
});

async function anthropicClient(gw) {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  return new Anthropic({ apiKey: CLIENT_KEY, baseURL: gw.url, maxRetries: 0, timeout: 30000 });
}

async function openaiClient(gw) {
  const { default: OpenAI } = await import('openai');
  return new OpenAI({ apiKey: CLIENT_KEY, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 30000 });
}

const N = 6;

for (const [name, gwName, upstreamPath] of [
  ['Anthropic SDK -> OpenAI account (translated)', 'openai', '/v1/chat/completions'],
  ['Anthropic SDK -> Anthropic account (passthrough)', 'anthropic', '/v1/messages'],
]) {
  test(`${name}: non-stream and stream`, async () => {
    const gw = gwName === 'openai' ? gwOpenAI : gwAnthropic;
    const client = await anthropicClient(gw);
    const text = `hello from the anthropic sdk [mock chunks=${N}]`;
    const msg = await client.messages.create({
      model: 'mock-claude', max_tokens: 100, system: 'be brief', messages: [{ role: 'user', content: text }],
    });
    assert.equal(msg.type, 'message');
    assert.equal(msg.content[0].text, mockText(N));
    assert.equal(msg.stop_reason, 'end_turn');
    assert.equal(msg.usage.output_tokens, N);
    assert.ok(msg.usage.input_tokens >= 1);
    const last = await mock.last();
    assert.equal(last.path, upstreamPath, 'the upstream got its own protocol');
    if (gwName === 'anthropic') assert.equal(last.headers['x-api-key'], UPSTREAM_KEY);
    else assert.equal(last.headers.authorization, `Bearer ${UPSTREAM_KEY}`);

    const stream = client.messages.stream({ model: 'mock-claude', max_tokens: 100, messages: [{ role: 'user', content: text }] });
    let got = '';
    stream.on('text', (t) => { got += t; });
    const final = await stream.finalMessage();
    assert.equal(got, mockText(N), 'the text arrived delta by delta');
    assert.equal(final.stop_reason, 'end_turn');
    assert.equal(final.usage.output_tokens, N);
  });
}

for (const [name, gwName, upstreamPath] of [
  ['OpenAI SDK -> Anthropic account (translated)', 'anthropic', '/v1/messages'],
  ['OpenAI SDK -> OpenAI account (passthrough)', 'openai', '/v1/chat/completions'],
]) {
  test(`${name}: non-stream and stream with usage`, async () => {
    const gw = gwName === 'openai' ? gwOpenAI : gwAnthropic;
    const client = await openaiClient(gw);
    const text = `hello from the openai sdk [mock chunks=${N}]`;
    const c = await client.chat.completions.create({
      model: 'mock-gpt', messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: text }],
    });
    assert.equal(c.choices[0].message.content, mockText(N));
    assert.equal(c.choices[0].finish_reason, 'stop');
    assert.equal(c.usage.completion_tokens, N);
    assert.equal((await mock.last()).path, upstreamPath);

    const s = await client.chat.completions.create({
      model: 'mock-gpt', stream: true, stream_options: { include_usage: true },
      messages: [{ role: 'user', content: text }],
    });
    let got = '';
    let usage = null;
    let finish = null;
    for await (const chunk of s) {
      if (chunk.choices?.[0]?.delta?.content) got += chunk.choices[0].delta.content;
      if (chunk.choices?.[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(got, mockText(N));
    assert.equal(finish, 'stop');
    assert.equal(usage?.completion_tokens, N, 'the usage chunk the client asked for');
  });
}

test('Responses API through the OpenAI SDK, stream and not', async () => {
  const client = await openaiClient(gwOpenAI);
  const r = await client.responses.create({ model: 'mock-gpt', input: `hi responses [mock chunks=${N}]` });
  assert.equal(r.output_text, mockText(N));
  assert.equal(r.usage.output_tokens, N);
  const s = await client.responses.create({ model: 'mock-gpt', input: `hi responses [mock chunks=${N}]`, stream: true });
  let got = '';
  let done = null;
  for await (const ev of s) {
    if (ev.type === 'response.output_text.delta') got += ev.delta;
    if (ev.type === 'response.completed') done = ev.response;
  }
  assert.equal(got, mockText(N));
  assert.equal(done?.usage?.output_tokens, N);
});

test('embeddings and count_tokens', async () => {
  const client = await openaiClient(gwOpenAI);
  const e = await client.embeddings.create({ model: 'mock-embed', input: ['a', 'b'] });
  assert.equal(e.data.length, 2);
  const anth = await anthropicClient(gwOpenAI);
  const n = await anth.messages.countTokens({ model: 'mock-claude', messages: [{ role: 'user', content: 'hello there' }] });
  assert.ok(n.input_tokens >= 1);
});

test('errors reach each SDK in its own shape', async () => {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const bad = new Anthropic({ apiKey: 'wrong-key-123456', baseURL: gwOpenAI.url, maxRetries: 0 });
  await assert.rejects(
    bad.messages.create({ model: 'm', max_tokens: 5, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.AuthenticationError && e.error?.type === 'error' && e.error?.error?.type === 'authentication_error',
  );
  // An upstream 429 from an Anthropic account reaches an OpenAI client as a RateLimitError.
  const { default: OpenAI } = await import('openai');
  const client = await openaiClient(gwAnthropic);
  await assert.rejects(
    client.chat.completions.create({ model: 'mock-gpt', messages: [{ role: 'user', content: 'x [mock status=429 retry_after=3]' }] }),
    (e) => e instanceof OpenAI.RateLimitError && e.status === 429,
  );
  // A request that cannot be translated is a 400 in the client's shape, never a crash.
  const r = await fetch(`${gwAnthropic.url}/v1/chat/completions`, {
    method: 'POST', headers: { authorization: `Bearer ${CLIENT_KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', n: 2, messages: [{ role: 'user', content: 'x' }] }),
  });
  assert.equal(r.status, 400);
  assert.equal((await r.json()).error.code, 'untranslatable_request');
});
