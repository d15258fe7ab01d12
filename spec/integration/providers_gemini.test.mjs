// Gemini accounts (issue #19, item 1): the official openai and @anthropic-ai/sdk clients
// — chat completions, Responses and Messages, streaming and not — served by an account
// of provider "gemini" (generateContent / streamGenerateContent?alt=sse with the key in
// x-goog-api-key). What a user notices: the text, the stop reason and usage in the
// client's shape, what the upstream received (its path, its key header, a Gemini body),
// and the usage row billed from usageMetadata (prompt minus cached = input, cached =
// cache reads, candidates + thoughts = output). The models list reads Gemini's shape.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { mockInputTokens, mockText, startMock, stopAll } from './lib/harness.mjs';
import { billedSetup, startBilledGateway, waitUsageRow } from './lib/billing.mjs';

const MODEL = 'gemini-2.5-flash';
const KEY = 'gk-test-gemini-key';
let mock, bill, gw;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({
    mock,
    prices: [{ model: MODEL, input: '1.00', output: '2.00', cache_read: '0.25' }],
    accounts: [{ name: 'up', provider: 'gemini', base_url: `${mock.url}/v1beta`, credential: KEY }],
  });
  gw = await startBilledGateway(bill, {}, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

async function openai() {
  const { default: OpenAI } = await import('openai');
  return new OpenAI({ apiKey: bill.key, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 30000 });
}

async function anthropic() {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  return new Anthropic({ apiKey: bill.key, baseURL: gw.url, maxRetries: 0, timeout: 30000 });
}

/** What the mock last received, checked as a Gemini call; returns its body. */
async function upstreamGemini(stream) {
  const last = await mock.last();
  assert.equal(last.path, `/v1beta/models/${MODEL}:${stream ? 'streamGenerateContent?alt=sse' : 'generateContent'}`);
  assert.equal(last.headers['x-goog-api-key'], KEY);
  assert.equal(last.headers.authorization, undefined, 'the client key never goes upstream');
  const body = JSON.parse(last.body);
  assert.equal(body.model, undefined, 'the model is in the path, not the body');
  assert.ok(Array.isArray(body.contents));
  return body;
}

/** The usage row of a request: what the ledger bills. */
async function billed(id, { input, cached, output }) {
  const row = await waitUsageRow(bill, id);
  assert.equal(Number(row.input_tokens), input, 'input = prompt - cached');
  assert.equal(Number(row.cache_read_tokens), cached, 'cache reads = cachedContentTokenCount');
  assert.equal(Number(row.output_tokens), output, 'output = candidates + thoughts');
  // 1.00 / 2.00 / 0.25 USD per million tokens.
  assert.equal(row.cost, BigInt(input) * 1000n + BigInt(output) * 2000n + BigInt(cached) * 250n);
  assert.equal(row.model, MODEL);
}

test('chat completions, not streamed: text, usage in OpenAI shape, billed from usageMetadata', async () => {
  const text = 'hello gemini [mock chunks=5 cached=2 thoughts=3]';
  const inTok = mockInputTokens({ messages: [{ content: text }] });
  const client = await openai();
  const r = await client.chat.completions
    .create({ model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: text }], max_tokens: 50 })
    .withResponse();
  const c = r.data;
  assert.equal(c.choices[0].message.content, mockText(5));
  assert.equal(c.choices[0].finish_reason, 'stop');
  // 'Be brief.' is read too (systemInstruction): 9 more bytes.
  const prompt = mockInputTokens({ messages: [{ content: text }, { content: 'Be brief.' }] });
  assert.ok(prompt >= inTok);
  assert.deepEqual(c.usage, {
    prompt_tokens: prompt, completion_tokens: 8, total_tokens: prompt + 8,
    prompt_tokens_details: { cached_tokens: 2 }, completion_tokens_details: { reasoning_tokens: 3 },
  });
  const body = await upstreamGemini(false);
  assert.deepEqual(body.systemInstruction, { parts: [{ text: 'Be brief.' }] });
  assert.deepEqual(body.contents, [{ role: 'user', parts: [{ text }] }]);
  assert.equal(body.generationConfig.maxOutputTokens, 50);
  await billed(r.response.headers.get('x-request-id'), { input: prompt - 2, cached: 2, output: 8 });
});

test('chat completions, streamed: the SDK assembles the text; the usage chunk is Gemini\'s last counts', async () => {
  const text = 'stream me [mock chunks=6 thoughts=1]';
  const client = await openai();
  const { data: stream, response } = await client.chat.completions
    .create({ model: MODEL, messages: [{ role: 'user', content: text }], stream: true, stream_options: { include_usage: true } })
    .withResponse();
  let got = '', finish = null, usage = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    if (ch.choices[0]?.delta?.content) got += ch.choices[0].delta.content;
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
    if (ch.usage) usage = ch.usage;
  }
  assert.equal(got, mockText(6));
  assert.equal(finish, 'stop');
  assert.ok(chunks >= 8);
  const inTok = mockInputTokens({ messages: [{ content: text }] });
  assert.equal(usage.prompt_tokens, inTok);
  assert.equal(usage.completion_tokens, 7);
  await upstreamGemini(true);
  await billed(response.headers.get('x-request-id'), { input: inTok, cached: 0, output: 7 });
});

test('Anthropic Messages, not streamed and streamed', async () => {
  const client = await anthropic();
  const text = 'from claude code [mock chunks=4]';
  const msg = await client.messages.create({ model: MODEL, max_tokens: 100, messages: [{ role: 'user', content: text }] });
  assert.equal(msg.type, 'message');
  assert.equal(msg.content[0].text, mockText(4));
  assert.equal(msg.stop_reason, 'end_turn');
  assert.equal(msg.usage.output_tokens, 4);
  assert.equal(msg.usage.input_tokens, mockInputTokens({ messages: [{ content: text }] }));
  await upstreamGemini(false);

  const stream = client.messages.stream({ model: MODEL, max_tokens: 3, messages: [{ role: 'user', content: text }] });
  let got = '';
  stream.on('text', (t) => { got += t; });
  const final = await stream.finalMessage();
  assert.equal(got, mockText(3), 'max_tokens reached Gemini as maxOutputTokens');
  assert.equal(final.usage.output_tokens, 3);
  const body = await upstreamGemini(true);
  assert.equal(body.generationConfig.maxOutputTokens, 3);
});

test('OpenAI Responses, not streamed and streamed', async () => {
  const client = await openai();
  const r = await client.responses.create({ model: MODEL, instructions: 'Be kind.', input: 'hi there [mock chunks=3]' });
  assert.equal(r.status, 'completed');
  assert.equal(r.output_text, mockText(3));
  assert.equal(r.usage.output_tokens, 3);
  const body = await upstreamGemini(false);
  assert.deepEqual(body.systemInstruction, { parts: [{ text: 'Be kind.' }] });

  const s = await client.responses.create({ model: MODEL, input: 'again [mock chunks=2]', stream: true });
  let got = '', done = null;
  for await (const ev of s) {
    if (ev.type === 'response.output_text.delta') got += ev.delta;
    if (ev.type === 'response.completed') done = ev.response;
  }
  assert.equal(got, mockText(2));
  assert.equal(done.usage.output_tokens, 2);
  await upstreamGemini(true);
});

test('a Gemini error reaches the client in its own shape', async () => {
  const client = await openai();
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x [mock status=400]' }] }),
    (e) => e.status === 400 && /injected error/.test(e.message),
  );
  const an = await anthropic();
  await assert.rejects(
    an.messages.create({ model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: 'x [mock status=400]' }] }),
    (e) => e.status === 400 && e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error',
  );
});

test("the models list reads Gemini's list", async () => {
  const client = await openai();
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  // The mock lists these three only in Gemini's shape ({"models":[{"name":"models/..."}]}),
  // only to a request with x-goog-api-key; its text-embedding-mock (embedContent only)
  // is left out.
  assert.deepEqual(ids, ['mock-gpt', 'mock-claude', 'mock-embed']);
});
