// Hostile JSON on the data plane: malformed, truncated, deep, duplicate-key and
// badly encoded bodies on every route, absurd numbers in every numeric field, and
// injection in every string that reaches a header, a log line, SQL or Redis. Each
// case: status + the route's error shape, an access-log line, a good request after it
// still served; at the end ledger verify is clean (spec/hostile/lib.mjs).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { waitFor } from '../integration/lib/harness.mjs';
import { lit } from '../integration/lib/db.mjs';
import {
  MODEL, anth, chat, finalChecks, hostileSetup, hostileTeardown, http, httpCase, resp, runCases,
} from './lib.mjs';

let S;
before(async () => {
  S = await hostileSetup();
});
after(() => hostileTeardown(S));

const ROUTES = [
  { route: 'chat', path: '/v1/chat/completions', shape: 'openai', good: chat },
  { route: 'messages', path: '/v1/messages', shape: 'anthropic', good: anth },
  { route: 'responses', path: '/v1/responses', shape: 'openai', good: resp },
  { route: 'embeddings', path: '/v1/embeddings', shape: 'openai', good: () => ({ model: MODEL, input: 'hi' }) },
];

const deep = (n, open, close, inner = '1') => open.repeat(n) + inner + close.repeat(n);
const bad = (body) => Buffer.isBuffer(body) ? body : Buffer.from(body, 'latin1');

// Malformed bodies: every one is refused before any upstream call, in the route's shape.
const MALFORMED = [
  ['truncated', '{"model":"mock-gpt","messages":[{"role":"user","content":"hi'],
  ['empty body', ''],
  ['an array, not an object', '[]'],
  ['a bare string', '"hello"'],
  ['null', 'null'],
  ['deep arrays (10k)', (g) => `{"model":"mock-gpt","messages":${deep(10000, '[', ']')}}`],
  ['deep objects (10k)', (g) => `{"model":"mock-gpt","x":${deep(10000, '{"a":', '}')}}`],
  ['duplicate key (model twice)', (g) => JSON.stringify(g()).replace('{', '{"model":"other-model",')],
  ['invalid UTF-8 in a string', (g) => Buffer.concat([Buffer.from('{"model":"mock-gpt","x":"'), Buffer.from([0xc3, 0x28, 0xff, 0xfe]), Buffer.from('"}')])],
  ['raw NUL byte in a string', (g) => Buffer.concat([Buffer.from('{"model":"mock'), Buffer.from([0]), Buffer.from('-gpt","messages":[]}')])],
  ['trailing garbage', (g) => `${JSON.stringify(g())}xyz`],
  ['two documents', (g) => `${JSON.stringify(g())}${JSON.stringify(g())}`],
  ['lone surrogate escape', (g) => JSON.stringify(g()).replace('"mock-gpt"', '"mock-\\ud800gpt"')],
  ['NaN literal', (g) => JSON.stringify(g()).replace('{', '{"temperature":NaN,')],
];

const cases = [];
for (const r of ROUTES) {
  for (const [what, body] of MALFORMED) {
    const b = typeof body === 'function' ? body(r.good) : body;
    // A lone surrogate escape is valid JSON syntax that jansson refuses; a NUL inside a
    // string likewise. All of these are 400 in the route's shape.
    cases.push(httpCase(`${r.route}: ${what}`, 'POST', r.path, bad(b), { status: 400, shape: r.shape }));
  }
}

// Numbers: absurd values in every numeric field. A value the gateway itself reads (the
// output-token bound, stream) is refused with 400 when it is not a usable number; a
// value it only passes on (temperature, top_p, n) may reach the upstream (the mock
// answers 200) — either way nothing crashes, the bill is right (ledger verify at the
// end), and the reservation is never below what the request can cost.
const NUMS = [
  // [what, field, value, expected status(es), todo]
  ['max_tokens 1e309', 'max_tokens', '1e309', 400],
  ['max_tokens -1', 'max_tokens', '-1', 400],
  ['max_tokens -0', 'max_tokens', '-0', 400],
  ['max_tokens 0', 'max_tokens', '0', 400],
  ['max_tokens 2^63', 'max_tokens', '9223372036854775808', [400, 402]],
  ['max_tokens 2^64+1', 'max_tokens', '18446744073709551617', [400, 402]],
  ['max_tokens 2^53+1', 'max_tokens', '9007199254740993', [400, 402]],
  ['max_tokens 1.5', 'max_tokens', '1.5', 400],
  ['max_tokens "100" (a string)', 'max_tokens', '"100"', 400],
  ['max_tokens 1e2 (exponent)', 'max_tokens', '1e2', 200],
  ['max_completion_tokens 2^63-1', 'max_completion_tokens', '9223372036854775807', [400, 402]],
  ['temperature 1e309', 'temperature', '1e309', 400],
  ['temperature -1e308', 'temperature', '-1e308', [200, 400]],
  ['top_p 2', 'top_p', '2', [200, 400]],
  ['n 1e9', 'n', '1000000000', [200, 400]],
  ['n -1', 'n', '-1', [200, 400]],
  ['stream 1 (a number)', 'stream', '1', 400],
  ['stream "true" (a string)', 'stream', '"true"', 400],
  ['stream null', 'stream', 'null', 200],
];
const withField = (obj, field, v) => {
  const o = { ...obj };
  delete o[field];
  return `{"${field}":${v},${JSON.stringify(o).slice(1)}`;
};
const numCase = (route, p, shape, good, [what, field, v, status, todo]) => ({
  ...httpCase(`${route}: ${what}`, 'POST', p, withField(good('numbers [mock chunks=2]'), field, v), { status, shape }),
  ...(todo ? { todo } : {}),
});
for (const n of NUMS) cases.push(numCase('chat', '/v1/chat/completions', 'openai', chat, n));
for (const n of [
  ['max_tokens 2^63', 'max_tokens', '9223372036854775808', [400, 402]],
  ['max_tokens -1', 'max_tokens', '-1', 400],
  ['max_tokens 1e309', 'max_tokens', '1e309', 400],
  ['temperature "x"', 'temperature', '"x"', [200, 400]],
]) cases.push(numCase('messages', '/v1/messages', 'anthropic', anth, n));
for (const n of [
  ['max_output_tokens 2^63', 'max_output_tokens', '9223372036854775808', [400, 402]],
  ['max_output_tokens -5', 'max_output_tokens', '-5', 400],
  ['max_output_tokens 1e309', 'max_output_tokens', '1e309', 400],
]) cases.push(numCase('responses', '/v1/responses', 'openai', resp, n));

// Injection: strings that reach a header (the upstream request), a log line, SQL (the
// usage row's model) or a Redis key. The group offers every model its account serves
// (no list), so the model goes upstream as a JSON string (200) or is refused in the
// route's shape; either way no header is injected (upstream or to the client) and a
// billed one is stored byte for byte in its usage row.
const INJECT = [
  ['model with CRLF + header', 'mock-gpt\r\nx-injected: 1'],
  ['model with LF only', 'mock-gpt\nx-injected: 1'],
  ['model with SQL', "mock-gpt'; DROP TABLE tenants; --"],
  ['model with quotes and backslashes', 'mock"gpt\\\'`'],
  ['model with a Redis hash tag', '{t:1}:money'],
  ['model with NUL escape', 'mock-gpt\u0000evil'],
  ['model 64 KB long', 'm'.repeat(65536)],
  ['model with format specifiers', '%s%n%x%p%s%s%s'],
  ['model of control chars', '\u0001\u0002\u001b[31m\u007f'],
];
for (const r of ROUTES.slice(0, 3)) {
  for (const [what, model] of INJECT) {
    cases.push({
      ...httpCase(`${r.route}: ${what}`, 'POST', r.path, { ...r.good('inject [mock chunks=1]'), model }, { status: [200, 400, 403, 404], shape: r.shape }),
      check: async (o, SS) => {
        assert.equal(o.res.headers['x-injected'], undefined, 'no injected response header');
        const last = await SS.mock.last();
        assert.equal(last.headers?.['x-injected'], undefined, 'no injected upstream header');
        if (o.res.status !== 200) return;
        const id = o.res.headers['x-request-id'];
        await waitFor(async () => Number(await SS.db.scalar(`SELECT count(*) FROM usage WHERE request_id = ${lit(id)}`)) === 1,
          { timeout: 5000, what: `usage row of ${id}` });
        assert.equal(await SS.db.scalar(`SELECT model = ${lit(model)} FROM usage WHERE request_id = ${lit(id)}`), 't',
          'the model is stored as sent');
      },
    });
  }
}
for (const [what, model] of [['model as a number', 42], ['model as an object', { a: 1 }], ['model as an array', ['mock-gpt']]]) {
  cases.push(httpCase(`chat: ${what}`, 'POST', '/v1/chat/completions', { ...chat(), model }, { status: 400, shape: 'openai' }));
  cases.push(httpCase(`messages: ${what}`, 'POST', '/v1/messages', { ...anth(), model }, { status: 400, shape: 'anthropic' }));
}

// Structure: the fields each protocol reads, with the wrong types.
cases.push(
  httpCase('chat: messages not an array', 'POST', '/v1/chat/completions', { model: MODEL, messages: 'hi' }, { status: 400, shape: 'openai' }),
  httpCase('chat: messages of numbers', 'POST', '/v1/chat/completions', { model: MODEL, messages: [1, 2, 3], max_tokens: 4 }, { status: [200, 400], shape: 'openai' }),
  httpCase('messages: system as a number', 'POST', '/v1/messages', { ...anth(), system: 5 }, { status: 400, shape: 'anthropic' }),
  httpCase('messages: content block of unknown type', 'POST', '/v1/messages', { ...anth(), messages: [{ role: 'user', content: [{ type: 'x-evil' }] }] }, { status: 400, shape: 'anthropic' }),
  httpCase('responses: input of nested arrays', 'POST', '/v1/responses', { ...resp(), input: [[[['x']]]] }, { status: [200, 400], shape: 'openai' }),
  httpCase('embeddings: input of 100k numbers', 'POST', '/v1/embeddings', { model: MODEL, input: Array.from({ length: 100000 }, () => 1) }, { status: [200, 400, 413], shape: 'openai' }),
  httpCase('models: POST is 405', 'POST', '/v1/models', {}, { status: 405, shape: 'openai' }),
  httpCase('models: query junk', 'GET', '/v1/models?x=%00%0d%0a&y=\'', undefined, { status: 200 }),
  httpCase('chat: content-type text/plain', 'POST', '/v1/chat/completions', JSON.stringify(chat()), { status: [200, 400, 415] }, { headers: { 'content-type': 'text/plain' } }),
  httpCase('chat: 200 KB of emoji in a message', 'POST', '/v1/chat/completions', chat(`${'😀'.repeat(50000)} [mock chunks=1]`), { status: 200 }),
  httpCase('messages: x-api-key with the key is served', 'POST', '/v1/messages', anth(), { status: 200 }, { key: false, headers: { 'x-api-key': '%KEY%' } }),
);

// Plugin decisions in the route's shape.
cases.push(
  httpCase('chat: plugin reject', 'POST', '/v1/chat/completions', chat(), { status: 403, shape: 'openai' }, { headers: { 'x-reject': '1' } }),
  httpCase('messages: plugin reject', 'POST', '/v1/messages', anth(), { status: 403, shape: 'anthropic' }, { headers: { 'x-reject': '1' } }),
);

// The key through hostile forms.
cases.push(
  httpCase('auth: key with trailing space', 'POST', '/v1/chat/completions', chat(), { status: 401, shape: 'openai', code: 'invalid_api_key' }, { key: false, headers: { authorization: 'Bearer %KEY% ' } }),
  httpCase('auth: key SQL', 'POST', '/v1/chat/completions', chat(), { status: 401, shape: 'openai', code: 'invalid_api_key' }, { key: "' OR '1'='1" }),
  httpCase('auth: 8 KB key', 'POST', '/v1/chat/completions', chat(), { status: [401, 431], shape: 'openai' }, { key: 'k'.repeat(7000) }),
  httpCase('auth (messages): unknown x-api-key', 'POST', '/v1/messages', anth(), { status: 401, shape: 'anthropic' }, { key: false, headers: { 'x-api-key': 'nope' } }),
);

// The SDK cases first: runCases puts the todo money cases last (they may poison a batch).
test('SDKs: absurd values through the official clients get typed errors, the worker stays up', async () => {
  const { default: OpenAI } = await import('openai');
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const oa = new OpenAI({ apiKey: S.key, baseURL: S.gw.baseURL, maxRetries: 0, timeout: 15000 });
  await assert.rejects(oa.chat.completions.create({ ...chat(), stream: 'yes' }), (e) => e.status === 400 && e.code === 'invalid_stream');
  await assert.rejects(oa.chat.completions.create({ ...chat(), max_tokens: 2 ** 64 }), (e) => [400, 402].includes(e.status) && typeof e.error?.message === 'string');
  await assert.rejects(oa.responses.create({ ...resp(), max_output_tokens: 2 ** 64 }), (e) => [400, 402].includes(e.status));
  const an = new Anthropic({ apiKey: S.key, baseURL: S.gw.url, maxRetries: 0, timeout: 15000 });
  await assert.rejects(an.messages.create({ ...anth(), max_tokens: 2 ** 64 }), (e) => [400, 402].includes(e.status) && e.error?.type === 'error');
  await assert.rejects(an.messages.create({ ...anth(), messages: 'not a list' }), (e) => e.status === 400 && e.error?.type === 'error');
  const ok = await an.messages.create(anth('sdk ok [mock chunks=2]'));
  assert.equal(ok.type, 'message');
  const r = await http(S.gw, 'POST', '/v1/chat/completions', { key: S.key, body: chat('after sdk [mock chunks=1]') });
  assert.equal(r.status, 200);
});

runCases(() => S, cases);

test('the end: ledger verify is clean, tables intact, gateway up', async () => {
  await finalChecks(S);
});
