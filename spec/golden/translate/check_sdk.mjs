// Replays every translated golden stream (spec/golden/translate/<case>/out.sse) and
// every translated non-stream body (out.json of response cases) through the official SDK
// of the client's protocol, with a fake fetch that answers those bytes, and checks what
// an application would get: the SDK's accumulated final message (Anthropic
// MessageStream.finalMessage, openai ChatCompletionStream.finalChatCompletion,
// ResponseStream.finalResponse) agrees with the deltas, tool-call arguments parse,
// usage and stop reasons are there; streams that end in an error make the SDK throw.
//
//   node --test spec/golden/translate/check_sdk.mjs      (ctest: sdk.translate_golden)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, existsSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, '../../package.json'));
const Anthropic = require('@anthropic-ai/sdk').default ?? require('@anthropic-ai/sdk');
const OpenAI = require('openai').default ?? require('openai');

// TG_GOLDEN_DIR picks another folder of cases in the same format (spec/golden/fidelity).
const root = process.env.TG_GOLDEN_DIR || here;
const cases = readdirSync(root, { withFileTypes: true })
  .filter((d) => d.isDirectory() && existsSync(join(root, d.name, 'case.json')))
  .map((d) => ({ name: d.name, dir: join(root, d.name), meta: JSON.parse(readFileSync(join(root, d.name, 'case.json'), 'utf8')) }));

// A case's "sdk" member names what the application must see: {"stop_reason": ...} for an
// Anthropic client, {"finish_reason": ...} for a chat client, {"status": ...} for Responses.
function expectSdk(c, got) {
  for (const [k, v] of Object.entries(c.meta.sdk ?? {})) assert.deepEqual(got[k], v, `${c.name}: ${k}`);
}

function fakeFetch(body, contentType) {
  return async () => new Response(body, { status: 200, headers: { 'content-type': contentType, 'request-id': 'req_golden' } });
}

function clients(body, contentType) {
  const opts = { apiKey: 'sk-golden', baseURL: 'http://golden.invalid/v1', fetch: fakeFetch(body, contentType), maxRetries: 0 };
  return { anthropic: new Anthropic(opts), openai: new OpenAI(opts) };
}

// Whether the golden stream ends in an error event (then the SDK must throw).
function endsInError(sse) {
  const events = sse.trim().split(/\n\n/);
  const last = events[events.length - 1];
  return /^event: error\n/.test(last) || /^data: \{"error":/.test(last);
}

// The text and tool arguments the deltas of a translated stream carry, per protocol.
function deltas(sse, to) {
  let text = '';
  const args = [];
  for (const ev of sse.split('\n\n')) {
    const m = /^data: (.*)$/m.exec(ev);
    if (!m || m[1] === '[DONE]') continue;
    const d = JSON.parse(m[1]);
    if (to === 'anthropic' && d.type === 'content_block_delta') {
      if (d.delta.type === 'text_delta') text += d.delta.text;
      if (d.delta.type === 'input_json_delta') args[args.length - 1] += d.delta.partial_json;
    } else if (to === 'anthropic' && d.type === 'content_block_start' && d.content_block.type === 'tool_use') {
      args.push('');
    } else if (to === 'openai_chat' && d.choices?.[0]?.delta) {
      const delta = d.choices[0].delta;
      if (delta.content) text += delta.content;
      for (const tc of delta.tool_calls ?? []) {
        if (tc.id) args[tc.index] = '';
        args[tc.index] += tc.function?.arguments ?? '';
      }
    } else if (to === 'responses' && d.type === 'response.output_text.delta') {
      text += d.delta;
    } else if (to === 'responses' && d.type === 'response.output_item.added' && d.item.type === 'function_call') {
      args.push('');
    } else if (to === 'responses' && d.type === 'response.function_call_arguments.delta') {
      args[args.length - 1] += d.delta;
    }
  }
  return { text, args };
}

for (const c of cases.filter((c) => c.meta.kind === 'stream' && c.meta.from !== c.meta.to)) {
  const sse = readFileSync(join(c.dir, 'out.sse'), 'utf8');
  const truncated = c.meta.finish === false;
  test(`${c.name}: ${c.meta.to} SDK`, async () => {
    const { anthropic, openai } = clients(sse, 'text/event-stream');
    const want = deltas(sse, c.meta.to);
    const run = async () => {
      if (c.meta.to === 'anthropic') {
        const s = anthropic.messages.stream({ model: 'm', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] });
        const msg = await s.finalMessage();
        assert.equal(msg.role, 'assistant');
        assert.ok(msg.stop_reason, 'stop_reason');
        assert.equal(typeof msg.usage.input_tokens, 'number');
        assert.equal(typeof msg.usage.output_tokens, 'number');
        assert.equal(msg.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), want.text);
        const tools = msg.content.filter((b) => b.type === 'tool_use');
        assert.deepEqual(tools.map((t) => t.input), want.args.map((a) => JSON.parse(a || '{}')));
        if (tools.length) assert.equal(msg.stop_reason, 'tool_use');
        expectSdk(c, { stop_reason: msg.stop_reason, usage: msg.usage });
      } else if (c.meta.to === 'openai_chat') {
        const s = openai.chat.completions.stream({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
        const done = await s.finalChatCompletion();
        const choice = done.choices[0];
        assert.ok(choice.finish_reason, 'finish_reason');
        assert.equal(choice.message.content ?? '', want.text);
        const calls = choice.message.tool_calls ?? [];
        assert.deepEqual(calls.map((t) => t.function.arguments), want.args);
        for (const t of calls) JSON.parse(t.function.arguments);
        if (calls.length) assert.equal(choice.finish_reason, 'tool_calls');
        if (c.meta.usage_chunk !== false) assert.equal(typeof done.usage?.completion_tokens, 'number');
        expectSdk(c, { finish_reason: choice.finish_reason, arguments: calls.map((t) => t.function.arguments) });
      } else {
        const s = openai.responses.stream({ model: 'm', input: 'hi' });
        const r = await s.finalResponse();
        assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
        // (finalResponse() adds output_text only when it parses a text format)
        const text = r.output.filter((o) => o.type === 'message')
          .flatMap((o) => o.content).filter((p) => p.type === 'output_text').map((p) => p.text).join('');
        assert.equal(text, want.text);
        const calls = r.output.filter((o) => o.type === 'function_call');
        assert.deepEqual(calls.map((o) => o.arguments), want.args);
        assert.equal(typeof r.usage.output_tokens, 'number');
        expectSdk(c, { status: r.status, arguments: calls.map((o) => o.arguments) });
      }
    };
    if (endsInError(sse) || truncated) {
      // An error event surfaces as the SDK's APIError; a cut stream as "ended without" a
      // message (never as a complete answer).
      await assert.rejects(run, truncated ? /without|ended|incomplete/i : (e) => e?.constructor?.name?.includes('APIError') || /error|Overloaded|ended/i.test(e.message));
    } else {
      await run();
    }
  });
}

for (const c of cases.filter((c) => c.meta.kind === 'response' && !c.meta.error && c.meta.from !== c.meta.to)) {
  const body = readFileSync(join(c.dir, 'out.json'), 'utf8');
  test(`${c.name}: ${c.meta.to} SDK`, async () => {
    const { anthropic, openai } = clients(body, 'application/json');
    if (c.meta.to === 'anthropic') {
      const msg = await anthropic.messages.create({ model: 'm', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(msg.type, 'message');
      assert.ok(Array.isArray(msg.content) && msg.stop_reason);
      for (const b of msg.content) if (b.type === 'tool_use') assert.equal(typeof b.input, 'object');
      expectSdk(c, { stop_reason: msg.stop_reason, usage: msg.usage });
    } else if (c.meta.to === 'openai_chat') {
      const done = await openai.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }] });
      assert.equal(done.object, 'chat.completion');
      for (const t of done.choices[0].message.tool_calls ?? []) JSON.parse(t.function.arguments);
    } else {
      const r = await openai.responses.create({ model: 'm', input: 'hi' });
      assert.equal(r.object, 'response');
      assert.equal(typeof r.output_text, 'string');
    }
  });
}
