// The request body is validated in one pass (proto/tg_json_scan.c) and its tree built
// only when a phase asks (issue 17, goal 5). What a client sees must not change: every
// malformed, hostile or badly typed body is refused with the same status, code and
// message as when jansson parsed every body, nothing reaches the upstream for it, a
// valid body goes upstream byte for byte, and a phase that needs the tree (a
// translation, the usage chunk of a stream, count_tokens) gets it.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { CLIENT_KEY, MODEL, fetchT, postJson, startGateway, startMock, stopAll } from './lib/harness.mjs';

let mock;
let gw;

before(async () => {
  mock = await startMock();
  gw = await startGateway({}, { mock });
});

after(stopAll);

const msgs = '"messages":[{"role":"user","content":"hi"}]';
const refused = [
  // [what, body, status, code, message (string: exact; RegExp)]
  ['not JSON', '{"model":', 400, 'invalid_json', /^request body is not valid JSON: .* \(at byte \d+\)$/],
  ['trailing bytes', `{"model":"${MODEL}",${msgs}} x`, 400, 'invalid_json', /end of file expected/],
  ['a duplicate top-level key', `{"model":"${MODEL}","model":"x",${msgs}}`, 400, 'invalid_json', /duplicate object key/],
  ['a duplicate nested key', `{"model":"${MODEL}","messages":[{"role":"user","role":"x","content":"hi"}]}`, 400, 'invalid_json', /duplicate object key/],
  ['a duplicate key spelled with an escape', `{"model":"${MODEL}",${msgs},"k\\u0061":1,"ka":2}`, 400, 'invalid_json', /duplicate object key/],
  ['\\u0000 in a string', `{"model":"${MODEL}","messages":[{"role":"user","content":"a\\u0000b"}]}`, 400, 'invalid_json', /\\u0000 is not allowed/],
  ['a lone surrogate', `{"model":"${MODEL}","messages":[{"role":"user","content":"\\udc00"}]}`, 400, 'invalid_json', /invalid Unicode/],
  ['overlong UTF-8', Buffer.from(`{"model":"${MODEL}","messages":[{"role":"user","content":"\xc0\xaf"}]}`, 'latin1'), 400, 'invalid_json', /Invalid UTF-8|unable to decode/],
  ['a raw control byte', `{"model":"${MODEL}","messages":[{"role":"user","content":"a\tb"}]}`, 400, 'invalid_json', /control character/],
  ['a real that overflows', `{"model":"${MODEL}",${msgs},"temperature":1e400}`, 400, 'invalid_json', /real number overflow/],
  ['a leading zero', `{"model":"${MODEL}",${msgs},"n":01}`, 400, 'invalid_json', /invalid token/],
  ['nesting past jansson\'s depth', `{"model":"${MODEL}",${msgs},"x":${'['.repeat(3000)}${']'.repeat(3000)}}`, 400, 'invalid_json', /maximum parsing depth/],
  ['an array', `[{"model":"${MODEL}"}]`, 400, 'invalid_request', 'request body must be a JSON object'],
  ['a top-level integer beyond int64', `{"model":"${MODEL}",${msgs},"seed":99999999999999999999}`, 400, 'invalid_number', 'seed: integer out of range'],
  ['no model', `{${msgs}}`, 400, 'missing_model', 'you must provide a model parameter'],
  ['a numeric model', `{"model":4,${msgs}}`, 400, 'invalid_model', 'model must be a non-empty string'],
  ['an empty model', `{"model":"",${msgs}}`, 400, 'invalid_model', 'model must be a non-empty string'],
  ['a model of 128 bytes', `{"model":"${'m'.repeat(128)}",${msgs}}`, 400, 'invalid_model', 'model must be a non-empty string'],
  ['messages not an array', `{"model":"${MODEL}","messages":"hi"}`, 400, 'missing_messages', 'messages must be an array'],
  ['stream not a boolean', `{"model":"${MODEL}",${msgs},"stream":"yes"}`, 400, 'invalid_stream', 'stream must be a boolean'],
];

/** postJson, with a body of raw bytes (a Buffer) sent as they are. */
async function post(body) {
  if (typeof body === 'string') return postJson(gw.url, '/v1/chat/completions', body);
  const r = await fetchT(`${gw.url}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${CLIENT_KEY}` }, body,
  }, 15000);
  const text = await r.text();
  return { status: r.status, text, json: JSON.parse(text) };
}

test('malformed, hostile and badly typed bodies are refused as before, and nothing reaches the upstream', async () => {
  await mock.reset();
  for (const [what, body, status, code, message] of refused) {
    const r = await post(body);
    assert.equal(r.status, status, `${what}: ${r.text}`);
    assert.equal(r.json?.error?.code, code, `${what}: ${r.text}`);
    if (message instanceof RegExp) assert.match(r.json.error.message, message, what);
    else assert.equal(r.json.error.message, message, what);
  }
  assert.equal((await mock.stats()).total, 0, 'no refused body reached the upstream');
});

test('Anthropic clients get the same refusals in the Anthropic error shape', async () => {
  const r = await postJson(gw.url, '/v1/messages', `{"model":"${MODEL}","max_tokens":5,"messages":[],"messages":[]}`);
  assert.equal(r.status, 400, r.text);
  assert.equal(r.json.type, 'error', r.text);
  assert.equal(r.json.error.type, 'invalid_request_error', r.text);
  assert.match(r.json.error.message, /^request body is not valid JSON: duplicate object key/);
  const m = await postJson(gw.url, '/v1/messages', '{"max_tokens":5,"messages":[]}');
  assert.equal(m.status, 400, m.text);
  assert.equal(m.json.type, 'error', m.text);
  assert.equal(m.json.error.message, 'you must provide a model parameter');
});

test('a valid body needs no tree: it reaches the upstream byte for byte, escapes, big numbers and NUL-free quirks included', async () => {
  const bodies = [
    `{"model":"${MODEL}","messages":[{"role":"user","content":"caf\\u00e9 \\ud83d\\ude00 \\"q\\" \u00e9"}],"max_tokens":16,"temperature":0.70}`,
    `{"model":"${MODEL}",${msgs},"tools":[{"type":"function","function":{"name":"f","parameters":{"maximum":18446744073709551615}}}]}`,
    `{"model":"gpt-4o\\u002dmini",${msgs}}`,
    ` {"model":"${MODEL}", ${msgs} , "stream": false}\n`,
  ];
  for (const body of bodies) {
    const r = await postJson(gw.url, '/v1/chat/completions', body);
    assert.equal(r.status, 200, `${body}: ${r.text}`);
    const last = await mock.last();
    assert.equal(last.body, body, 'the upstream received the client\'s bytes');
  }
});

test('a phase that asks gets the tree: a chat stream asks for the usage chunk, a translation, count_tokens', async () => {
  const s = await postJson(gw.url, '/v1/chat/completions', `{"model":"${MODEL}",${msgs},"stream":true}`);
  assert.equal(s.status, 200, s.text);
  assert.match(s.text, /data: \[DONE\]/);
  assert.deepEqual(JSON.parse((await mock.last()).body).stream_options, { include_usage: true });
  const a = await postJson(gw.url, '/v1/messages', `{"model":"${MODEL}","max_tokens":7,"messages":[{"role":"user","content":"hi"}]}`);
  assert.equal(a.status, 200, a.text);
  assert.equal(a.json.type, 'message', a.text);
  const sent = JSON.parse((await mock.last()).body);
  assert.deepEqual(sent.messages, [{ role: 'user', content: 'hi' }], 'translated from the tree');
  const c = await postJson(gw.url, '/v1/messages/count_tokens', `{"model":"${MODEL}","messages":[{"role":"user","content":"hello there"}]}`);
  assert.equal(c.status, 200, c.text);
  assert.ok(c.json.input_tokens >= 1, c.text);
});
