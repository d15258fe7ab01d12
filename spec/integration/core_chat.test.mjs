// Chat completions through the real gateway with the official OpenAI SDK: the answer
// and usage the mock produced reach the client unchanged, a stream arrives chunk by
// chunk (not buffered), and the upstream sees the gateway's credential and
// stream_options.include_usage, never the client's key.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import {
  CLIENT_KEY, MODEL, UPSTREAM_KEY, chatBody, fetchT, mockDirect, mockInputTokens, mockText, openaiClient, startGateway,
  startMock, stopAll,
} from './lib/harness.mjs';

let mock;
let gw;
let client;

before(async () => {
  mock = await startMock();
  gw = await startGateway({}, { mock });
  client = await openaiClient(gw);
});

after(stopAll);

test('non-stream: content and usage are exactly what the mock produced', async () => {
  const text = 'Say hello to tollgate. [mock chunks=5]';
  const expected = (await mockDirect(mock, chatBody(text))).json;
  assert.equal(expected.usage.completion_tokens, 5, 'mock: output tokens = chunks');
  assert.equal(expected.choices[0].message.content, mockText(5), 'mock: its documented answer');
  assert.equal(expected.usage.prompt_tokens, mockInputTokens(chatBody(text)), 'mock: its documented input formula');

  const res = await client.chat.completions.create(chatBody(text));
  assert.equal(res.object, 'chat.completion');
  assert.equal(res.choices.length, 1);
  assert.equal(res.choices[0].message.role, 'assistant');
  assert.equal(res.choices[0].message.content, expected.choices[0].message.content);
  assert.ok(res.choices[0].message.content.length > 0, 'non-empty content');
  assert.equal(res.usage.completion_tokens, 5);
  assert.equal(res.usage.prompt_tokens, mockInputTokens(chatBody(text)));
  assert.ok(res.usage.prompt_tokens > 0);
  assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + res.usage.completion_tokens);

  const last = await mock.last();
  assert.equal(last.method, 'POST');
  assert.match(last.path, /\/v1\/chat\/completions$/);
  assert.equal(last.headers.authorization, `Bearer ${UPSTREAM_KEY}`);
  assert.ok(!JSON.stringify(last).includes(CLIENT_KEY), 'the client key never reaches the upstream');
  const sent = JSON.parse(last.body);
  assert.equal(sent.model, MODEL);
  assert.deepEqual(sent.messages, [{ role: 'user', content: text }]);
});

test('non-stream: max_tokens caps the output tokens', async () => {
  const res = await client.chat.completions.create(chatBody('cap me [mock chunks=20]', { max_tokens: 3 }));
  assert.equal(res.usage.completion_tokens, 3);
});

test('stream: chunks arrive incrementally and concatenate to the mock text', async () => {
  const text = 'Stream please. [mock chunks=10 interval_ms=100]';
  const expected = await mockDirect(mock, chatBody(text, { stream: true }));
  assert.equal(expected.content, mockText(10));

  const t0 = Date.now();
  const stream = await client.chat.completions.create(chatBody(text, { stream: true }));
  const stamps = [];
  let content = '';
  let usage = null;
  let events = 0;
  for await (const chunk of stream) {
    events++;
    const d = chunk.choices?.[0]?.delta?.content;
    if (d) {
      stamps.push(Date.now());
      content += d;
    }
    if (chunk.usage) usage = chunk.usage;
    assert.ok(events < 1000, 'bounded');
  }
  assert.equal(content, expected.content, 'the stream text is exactly what the mock produced');
  assert.ok(stamps.length >= 2, `several content chunks (got ${stamps.length})`);
  const spread = stamps[stamps.length - 1] - stamps[0];
  assert.ok(spread > 500, `first chunk reached the client ${spread} ms before the last (want > 500: not buffered)`);
  assert.ok(stamps[0] - t0 < 1500, `first chunk after ${stamps[0] - t0} ms (mock sends it at once)`);
  if (usage) assert.equal(usage.completion_tokens, 10);

  const last = await mock.last();
  const sent = JSON.parse(last.body);
  assert.equal(sent.stream, true);
  assert.equal(sent.stream_options?.include_usage, true, 'gateway asks the upstream for usage');
  assert.equal(last.headers.authorization, `Bearer ${UPSTREAM_KEY}`);
  assert.ok(!JSON.stringify(last).includes(CLIENT_KEY), 'the client key never reaches the upstream');
});

test('stream with include_usage: the client gets the usage chunk', async () => {
  const stream = await client.chat.completions.create(
    chatBody('usage please [mock chunks=4]', { stream: true, stream_options: { include_usage: true } }));
  let usage = null;
  let n = 0;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    assert.ok(++n < 1000);
  }
  assert.ok(usage, 'a usage chunk reached the client');
  assert.equal(usage.completion_tokens, 4);
  assert.ok(usage.prompt_tokens > 0);
  assert.equal(usage.prompt_tokens, mockInputTokens(chatBody('usage please [mock chunks=4]')));
});

test('stream via raw fetch is text/event-stream ending in [DONE]', async () => {
  const r = await fetchT(`${gw.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${CLIENT_KEY}`, 'content-type': 'application/json' },
    body: JSON.stringify(chatBody('raw [mock chunks=3]', { stream: true })),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  assert.ok(r.headers.get('x-request-id'));
  const body = await r.text();
  assert.match(body, /data: \[DONE\]\s*$/);
});

test('GET /v1/models is the upstream list', async () => {
  const direct = await (await fetchT(`${mock.url}/v1/models`, { headers: { authorization: `Bearer ${UPSTREAM_KEY}` } })).json();
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) {
    ids.push(m.id);
    assert.ok(ids.length < 10000);
  }
  assert.deepEqual(ids, direct.data.map((m) => m.id));
  assert.ok(ids.length > 0);

  const r = await fetchT(`${gw.baseURL}/models`, { headers: { authorization: `Bearer ${CLIENT_KEY}` } });
  assert.equal(r.status, 200);
  const j = await r.json();
  assert.equal(j.object, 'list');
  assert.deepEqual(j.data, direct.data);
});
