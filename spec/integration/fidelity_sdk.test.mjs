// Issue #15: what crosses the translator arrives as the client meant it. The official
// openai and @anthropic-ai/sdk clients go through the real gateway to the mock, which
// records what the upstream received (/_mock/last) and, for the answers a test needs
// (a tool call without arguments, a refusal, numbers beyond int64), replies with a
// scripted body (POST /_mock/faults {"body": ...}). Each defect of the issue has a test
// here that failed before its fix; the recorded-request comparisons at the end check,
// field by field, what the upstream got against what the client sent, in every
// direction (chat -> Anthropic, Messages -> OpenAI, Responses -> OpenAI and -> Anthropic,
// and pass-through).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { CLIENT_KEY, UPSTREAM_KEY, fetchT, postJson, startGateway, startMock, stopAll } from './lib/harness.mjs';

let mock;
let gwOpenAI; // static upstream speaking OpenAI
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

/** The next upstream request is answered with `body` verbatim (plus any knobs). */
async function script(body, knobs = {}) {
  const r = await fetchT(`${mock.url}/_mock/faults`, {
    method: 'POST',
    body: JSON.stringify({ credential: UPSTREAM_KEY, count: 1, body, ...knobs }),
  });
  assert.equal(r.status, 200, await r.text());
}

/** The body the upstream received for the latest request, parsed, and its raw text. */
async function upstreamGot() {
  const last = await mock.last();
  return { path: last.path, raw: last.body, body: JSON.parse(last.body) };
}

const sse = (events) => events.map(([ev, data]) => `${ev ? `event: ${ev}\n` : ''}data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`).join('');

// An Anthropic stream with one tool call that has no arguments (input {} and one empty
// input_json_delta, as Anthropic sends it).
const NO_ARGS_SSE = sse([
  ['message_start', { type: 'message_start', message: { id: 'msg_noargs', type: 'message', role: 'assistant', content: [], model: 'mock-claude', stop_reason: null, stop_sequence: null, usage: { input_tokens: 9, output_tokens: 1 } } }],
  ['content_block_start', { type: 'content_block_start', index: 0, content_block: { type: 'tool_use', id: 'toolu_noargs', name: 'get_time', input: {} } }],
  ['content_block_delta', { type: 'content_block_delta', index: 0, delta: { type: 'input_json_delta', partial_json: '' } }],
  ['content_block_stop', { type: 'content_block_stop', index: 0 }],
  ['message_delta', { type: 'message_delta', delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 5 } }],
  ['message_stop', { type: 'message_stop' }],
]);

const TOOLS_CHAT = [{ type: 'function', function: { name: 'get_time', description: 'the time', parameters: { type: 'object', properties: {} } } }];

test('1. a streamed tool call without arguments reaches chat and Responses clients as "{}"', async () => {
  const client = await openaiClient(gwAnthropic);
  await script(NO_ARGS_SSE);
  const s = client.chat.completions.stream({ model: 'mock-claude', messages: [{ role: 'user', content: 'time?' }], tools: TOOLS_CHAT });
  const done = await s.finalChatCompletion();
  const call = done.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'get_time');
  assert.equal(call.function.arguments, '{}');
  assert.deepEqual(JSON.parse(call.function.arguments), {});
  assert.equal(done.choices[0].finish_reason, 'tool_calls');

  await script(NO_ARGS_SSE);
  const rs = client.responses.stream({ model: 'mock-claude', input: 'time?', tools: [{ type: 'function', name: 'get_time', parameters: { type: 'object', properties: {} } }] });
  const r = await rs.finalResponse();
  const fc = r.output.find((o) => o.type === 'function_call');
  assert.equal(fc.arguments, '{}');
  assert.deepEqual(JSON.parse(fc.arguments), {});

  // Non-stream, the same call was already "{}": both agree.
  await script(JSON.stringify({ id: 'msg_n', type: 'message', role: 'assistant', model: 'mock-claude', content: [{ type: 'tool_use', id: 'toolu_n', name: 'get_time', input: {} }], stop_reason: 'tool_use', stop_sequence: null, usage: { input_tokens: 9, output_tokens: 5 } }));
  const ns = await client.chat.completions.create({ model: 'mock-claude', messages: [{ role: 'user', content: 'time?' }], tools: TOOLS_CHAT });
  assert.equal(ns.choices[0].message.tool_calls[0].function.arguments, '{}');
});

test('2. a refusal from an OpenAI account is stop_reason "refusal" for an Anthropic client, stream or not', async () => {
  const client = await anthropicClient(gwOpenAI);
  const chunk = (delta, finish = null) => ({ id: 'chatcmpl-ref', object: 'chat.completion.chunk', created: 1700000000, model: 'mock-gpt', choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] });
  await script(sse([
    [null, chunk({ role: 'assistant', content: null, refusal: '' })],
    [null, chunk({ refusal: "I can't help with that." })],
    [null, chunk({}, 'stop')],
    [null, { id: 'chatcmpl-ref', object: 'chat.completion.chunk', created: 1700000000, model: 'mock-gpt', choices: [], usage: { prompt_tokens: 7, completion_tokens: 6, total_tokens: 13 } }],
    [null, '[DONE]'],
  ]));
  const s = client.messages.stream({ model: 'mock-gpt', max_tokens: 50, messages: [{ role: 'user', content: 'something bad' }] });
  const msg = await s.finalMessage();
  assert.equal(msg.content[0].text, "I can't help with that.");
  assert.equal(msg.stop_reason, 'refusal');

  await script(JSON.stringify({ id: 'chatcmpl-ref2', object: 'chat.completion', created: 1700000000, model: 'mock-gpt', choices: [{ index: 0, message: { role: 'assistant', content: null, refusal: "I can't help with that." }, logprobs: null, finish_reason: 'stop' }], usage: { prompt_tokens: 7, completion_tokens: 6, total_tokens: 13 } }));
  const ns = await client.messages.create({ model: 'mock-gpt', max_tokens: 50, messages: [{ role: 'user', content: 'something bad' }] });
  assert.equal(ns.stop_reason, 'refusal');
});

test('3. an Anthropic tool_result with is_error keeps its meaning for an OpenAI account', async () => {
  const client = await anthropicClient(gwOpenAI);
  await client.messages.create({
    model: 'mock-gpt', max_tokens: 20,
    tools: [{ name: 'read_file', input_schema: { type: 'object', properties: { path: { type: 'string' } } } }],
    messages: [
      { role: 'user', content: 'read /etc/x [mock chunks=1]' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_e', name: 'read_file', input: { path: '/etc/x' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_e', is_error: true, content: 'permission denied' }] },
    ],
  });
  const { body } = await upstreamGot();
  const tool = body.messages.find((m) => m.role === 'tool');
  assert.equal(tool.tool_call_id, 'toolu_e');
  assert.equal(tool.content, 'Error: permission denied');
});

test('4. numbers beyond int64 and reals cross exactly, translated or passed through', async () => {
  const BIG = '18446744073709551615';
  const schema = `{"type":"object","properties":{"n":{"type":"integer","maximum":${BIG},"multipleOf":0.1}}}`;
  // (a) pass-through: the body holding one is not refused, and reaches the upstream as sent.
  const pass = `{"model":"mock-gpt","messages":[{"role":"user","content":"count [mock chunks=1]"}],"tools":[{"type":"function","function":{"name":"count","parameters":${schema}}}]}`;
  const r1 = await postJson(gwOpenAI.url, '/v1/chat/completions', pass);
  assert.equal(r1.status, 200, r1.text);
  assert.equal((await upstreamGot()).raw, pass, 'the upstream got the client bytes');
  // ... and translated, to an Anthropic account: the schema's digits and 0.1 kept.
  const r2 = await postJson(gwAnthropic.url, '/v1/chat/completions', pass);
  assert.equal(r2.status, 200, r2.text);
  assert.ok((await upstreamGot()).raw.includes(`"input_schema":${schema}`));

  // (b) a request's tool-call arguments holding one, to an Anthropic account.
  const args = `{"id": 18446744073709551616, "p": 0.1}`;
  const r3 = await postJson(gwAnthropic.url, '/v1/chat/completions', {
    model: 'mock-claude',
    messages: [
      { role: 'user', content: 'look up [mock chunks=1]' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'lookup', arguments: args } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'found' },
    ],
  });
  assert.equal(r3.status, 200, r3.text);
  assert.ok((await upstreamGot()).raw.includes('"input":{"id":18446744073709551616,"p":0.1}'));

  // (c) a non-stream Anthropic answer whose tool input holds one: a chat client gets it.
  await script(`{"id":"msg_big","type":"message","role":"assistant","model":"mock-claude","content":[{"type":"tool_use","id":"toolu_big","name":"count","input":{"n":18446744073709551616,"f":0.1}}],"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":5}}`);
  const client = await openaiClient(gwAnthropic);
  const c = await client.chat.completions.create({ model: 'mock-claude', messages: [{ role: 'user', content: 'count' }] });
  assert.equal(c.choices[0].message.tool_calls[0].function.arguments, '{"n":18446744073709551616,"f":0.1}');

  // (d) an OpenAI answer's arguments holding one reach an Anthropic client with its digits.
  await script(JSON.stringify({ id: 'chatcmpl-big', object: 'chat.completion', created: 1700000000, model: 'mock-gpt', choices: [{ index: 0, message: { role: 'assistant', content: null, tool_calls: [{ id: 'call_big', type: 'function', function: { name: 'count', arguments: '{"n": 18446744073709551616, "f": 0.1}' } }] }, logprobs: null, finish_reason: 'tool_calls' }], usage: { prompt_tokens: 5, completion_tokens: 5, total_tokens: 10 } }));
  const r4 = await postJson(gwOpenAI.url, '/v1/messages', { model: 'mock-gpt', max_tokens: 20, messages: [{ role: 'user', content: 'count' }] });
  assert.equal(r4.status, 200, r4.text);
  assert.ok(r4.text.includes('"input":{"n": 18446744073709551616, "f": 0.1}'), r4.text);
  // Through the SDK (JavaScript numbers are doubles): the input is an object, not {}.
  await script(JSON.stringify({ id: 'chatcmpl-big', object: 'chat.completion', created: 1700000000, model: 'mock-gpt', choices: [{ index: 0, message: { role: 'assistant', content: null, tool_calls: [{ id: 'call_big', type: 'function', function: { name: 'count', arguments: '{"n": 18446744073709551616, "f": 0.1}' } }] }, logprobs: null, finish_reason: 'tool_calls' }] }));
  const anth = await anthropicClient(gwOpenAI);
  const m = await anth.messages.create({ model: 'mock-gpt', max_tokens: 20, messages: [{ role: 'user', content: 'count' }] });
  assert.equal(m.content[0].input.f, 0.1);
  assert.equal(typeof m.content[0].input.n, 'number');

  // A top-level parameter that big is refused, in the client's shape.
  const r5 = await postJson(gwOpenAI.url, '/v1/chat/completions', `{"model":"mock-gpt","max_tokens":${BIG},"messages":[{"role":"user","content":"x"}]}`);
  assert.equal(r5.status, 400);
  assert.equal(r5.json.error.code, 'invalid_number');
  assert.match(r5.json.error.message, /max_tokens/);
});

test('5. web_search_options for an Anthropic account is refused like web search tools', async () => {
  const { default: OpenAI } = await import('openai');
  const client = await openaiClient(gwAnthropic);
  const before = (await mock.stats()).total;
  await assert.rejects(
    client.chat.completions.create({ model: 'mock-claude', web_search_options: {}, messages: [{ role: 'user', content: 'news?' }] }),
    (e) => e instanceof OpenAI.BadRequestError && /web_search_options/.test(e.message),
  );
  assert.equal((await mock.stats()).total, before, 'nothing reached the upstream');
});

test('6. an assistant turn holding only a refusal reaches an Anthropic account', async () => {
  const client = await openaiClient(gwAnthropic);
  await client.chat.completions.create({
    model: 'mock-claude',
    messages: [
      { role: 'user', content: 'do something bad' },
      { role: 'assistant', content: null, refusal: "I can't help with that." },
      { role: 'user', content: 'then a joke [mock chunks=1]' },
    ],
  });
  const { body } = await upstreamGot();
  assert.deepEqual(body.messages.map((m) => m.role), ['user', 'assistant', 'user'], 'the user turns stay apart');
  assert.deepEqual(body.messages[1].content, [{ type: 'text', text: "I can't help with that." }]);
});

test('7. an Anthropic client of an OpenAI account gets both cache counts, stream or not', async () => {
  const client = await anthropicClient(gwOpenAI);
  const msg = await client.messages.create({ model: 'mock-gpt', max_tokens: 20, messages: [{ role: 'user', content: 'hi [mock chunks=2]' }] });
  assert.equal(msg.usage.cache_creation_input_tokens, 0);
  assert.equal(msg.usage.cache_read_input_tokens, 0);
  const s = client.messages.stream({ model: 'mock-gpt', max_tokens: 20, messages: [{ role: 'user', content: 'hi [mock chunks=2]' }] });
  const fin = await s.finalMessage();
  assert.equal(fin.usage.cache_creation_input_tokens, 0);
  assert.equal(fin.usage.output_tokens, 2);
});

test('9. an upstream answer delimited by the connection close is a complete answer', async () => {
  const client = await openaiClient(gwOpenAI);
  // Pass-through stream: every chunk and the end arrive.
  const s = await client.chat.completions.create({ model: 'mock-gpt', stream: true, messages: [{ role: 'user', content: 'hi [mock chunks=3 close_delimited=1]' }] });
  let text = '';
  let finish = null;
  for await (const ch of s) {
    text += ch.choices?.[0]?.delta?.content ?? '';
    finish = ch.choices?.[0]?.finish_reason ?? finish;
  }
  assert.equal(text, 'tok1 tok2 tok3 ');
  assert.equal(finish, 'stop');
  // Translated stream (Anthropic client, OpenAI account): message_stop arrives.
  const anth = await anthropicClient(gwOpenAI);
  const as = anth.messages.stream({ model: 'mock-gpt', max_tokens: 20, messages: [{ role: 'user', content: 'hi [mock chunks=2 close_delimited=1]' }] });
  const fin = await as.finalMessage();
  assert.equal(fin.stop_reason, 'end_turn');
  assert.equal(fin.content[0].text, 'tok1 tok2 ');
  // Non-stream, and an Anthropic account streaming to a chat client.
  const ns = await client.chat.completions.create({ model: 'mock-gpt', messages: [{ role: 'user', content: 'hi [mock chunks=2 close_delimited=1]' }] });
  assert.equal(ns.choices[0].message.content, 'tok1 tok2 ');
  const oa = await openaiClient(gwAnthropic);
  const s2 = oa.chat.completions.stream({ model: 'mock-claude', messages: [{ role: 'user', content: 'hi [mock chunks=2 close_delimited=1]' }] });
  const done = await s2.finalChatCompletion();
  assert.equal(done.choices[0].message.content, 'tok1 tok2 ');
  assert.equal(done.choices[0].finish_reason, 'stop');
  // The raw bytes: the client's stream ends with its terminator.
  const raw = await postJson(gwOpenAI.url, '/v1/chat/completions', { model: 'mock-gpt', stream: true, messages: [{ role: 'user', content: 'hi [mock chunks=2 close_delimited=1]' }] });
  assert.equal(raw.status, 200);
  assert.ok(raw.text.endsWith('data: [DONE]\n\n'), raw.text.slice(-200));
});

// ---- recorded requests, field by field ---------------------------------------------------

const IMG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==';

/** Compares every field of `got` with `want`: nothing lost, nothing invented. */
function sameFields(got, want, what) {
  assert.deepEqual(Object.keys(got).sort(), Object.keys(want).sort(), `${what}: the upstream's fields`);
  for (const k of Object.keys(want)) assert.deepEqual(got[k], want[k], `${what}: ${k}`);
}

test('recorded: chat client -> Anthropic account', async () => {
  const client = await openaiClient(gwAnthropic);
  await client.chat.completions.create({
    model: 'mock-claude', max_completion_tokens: 77, temperature: 0.5, top_p: 0.9, stop: ['END'], user: 'u-1',
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false,
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }],
    messages: [
      { role: 'system', content: 'be brief' },
      { role: 'user', content: [{ type: 'text', text: 'weather? [mock chunks=1]' }, { type: 'image_url', image_url: { url: `data:image/png;base64,${IMG}` } }] },
      { role: 'assistant', content: 'checking', tool_calls: [{ id: 'call_w', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] },
      { role: 'tool', tool_call_id: 'call_w', content: 'sunny' },
    ],
  });
  const { path, body } = await upstreamGot();
  assert.equal(path, '/v1/messages');
  sameFields(body, {
    model: 'mock-claude', max_tokens: 77, system: 'be brief', temperature: 0.5, top_p: 0.9, stop_sequences: ['END'],
    metadata: { user_id: 'u-1' },
    tools: [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }],
    tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true },
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'weather? [mock chunks=1]' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: IMG } }] },
      { role: 'assistant', content: [{ type: 'text', text: 'checking' }, { type: 'tool_use', id: 'call_w', name: 'get_weather', input: { city: 'Oslo' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_w', content: 'sunny' }] },
    ],
  }, 'chat -> anthropic');
});

test('recorded: Messages client -> OpenAI account', async () => {
  const client = await anthropicClient(gwOpenAI);
  await client.messages.create({
    model: 'mock-gpt', max_tokens: 55, temperature: 0.3, top_p: 0.8, stop_sequences: ['STOP'], metadata: { user_id: 'u-2' },
    system: [{ type: 'text', text: 'sys one' }, { type: 'text', text: 'sys two' }],
    tools: [{ name: 'lookup', description: 'look', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }],
    tool_choice: { type: 'any' },
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'find it [mock chunks=1]' }, { type: 'document', source: { type: 'base64', media_type: 'application/pdf', data: 'JVBERi0=' } }] },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_l', name: 'lookup', input: { q: 'x' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_l', content: [{ type: 'text', text: 'result' }] }] },
    ],
  });
  const { path, body } = await upstreamGot();
  assert.equal(path, '/v1/chat/completions');
  sameFields(body, {
    model: 'mock-gpt', max_completion_tokens: 55, temperature: 0.3, top_p: 0.8, stop: ['STOP'], user: 'u-2',
    tools: [{ type: 'function', function: { name: 'lookup', description: 'look', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }],
    tool_choice: 'required',
    messages: [
      { role: 'system', content: 'sys one\n\nsys two' },
      { role: 'user', content: [{ type: 'text', text: 'find it [mock chunks=1]' }, { type: 'file', file: { file_data: 'data:application/pdf;base64,JVBERi0=' } }] },
      { role: 'assistant', content: null, tool_calls: [{ id: 'toolu_l', type: 'function', function: { name: 'lookup', arguments: '{"q":"x"}' } }] },
      { role: 'tool', tool_call_id: 'toolu_l', content: 'result' },
    ],
  }, 'messages -> openai');
});

const RESPONSES_REQ = {
  model: 'mock-x', instructions: 'be brief', max_output_tokens: 66, temperature: 0.4, top_p: 0.7,
  tools: [{ type: 'function', name: 'lookup', description: 'look', parameters: { type: 'object', properties: { q: { type: 'string' } } }, strict: false }],
  tool_choice: 'auto',
  input: [
    { role: 'user', content: [{ type: 'input_text', text: 'find [mock chunks=1]' }] },
    { type: 'function_call', call_id: 'call_r', name: 'lookup', arguments: '{"q":"y"}' },
    { type: 'function_call_output', call_id: 'call_r', output: 'found' },
  ],
};

test('recorded: Responses client -> OpenAI account (pass-through) and -> Anthropic account', async () => {
  const client = await openaiClient(gwOpenAI);
  await client.responses.create(RESPONSES_REQ);
  let got = await upstreamGot();
  assert.equal(got.path, '/v1/responses');
  sameFields(got.body, RESPONSES_REQ, 'responses -> openai');

  const anth = await openaiClient(gwAnthropic);
  await anth.responses.create(RESPONSES_REQ);
  got = await upstreamGot();
  assert.equal(got.path, '/v1/messages');
  sameFields(got.body, {
    model: 'mock-x', system: 'be brief', max_tokens: 66, temperature: 0.4, top_p: 0.7,
    tools: [{ name: 'lookup', description: 'look', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }],
    tool_choice: { type: 'auto' },
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'find [mock chunks=1]' }] },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'call_r', name: 'lookup', input: { q: 'y' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_r', content: 'found' }] },
    ],
  }, 'responses -> anthropic');
});

test('recorded: pass-through (chat -> OpenAI, Messages -> Anthropic) keeps the client bytes', async () => {
  const chat = '{"model":"mock-gpt","temperature":0.1,"seed":7,"messages":[{"role":"user","content":"hi [mock chunks=1]"}],"max_tokens":9}';
  const r1 = await postJson(gwOpenAI.url, '/v1/chat/completions', chat);
  assert.equal(r1.status, 200);
  assert.equal((await upstreamGot()).raw, chat);
  const msg = '{"model":"mock-claude","max_tokens":9,"top_k":5,"temperature":0.1,"messages":[{"role":"user","content":"hi [mock chunks=1]"}]}';
  const r2 = await postJson(gwAnthropic.url, '/v1/messages', msg);
  assert.equal(r2.status, 200);
  assert.equal((await upstreamGot()).raw, msg);
});
