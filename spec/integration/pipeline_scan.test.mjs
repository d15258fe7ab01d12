// Issue 17 (pipeline): with billing on, admission, the reservation's bound and sticky
// routing read the request body from its one validating pass (tg_json_scan) instead
// of a jansson tree. What the upstream receives must not change: billing's default
// cap is written into the client's bytes under the spelling the upstream takes, a
// phase that builds the tree later (a translation, a whole re-serialisation) finds the
// cap in it, and a limit the scan cannot read as an integer goes the tree's way with
// the same answers as before.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { startMock, stopAll } from './lib/harness.mjs';
import { chat } from './lib/db.mjs';
import { billedSetup, reservationFor, reservedBound, startBilledGateway, CRED } from './lib/billing.mjs';

const CAP = 2500;
const PRICES = [{ model: 'gpt-5-mini', input: '1.00', output: '2.00' }, { model: 'claude-x', input: '1.00', output: '2.00' }];
let mock;
let t; // one group: an OpenAI account for gpt-5-mini, an Anthropic one for claude-x (translated)

before(async () => {
  mock = await startMock();
  const bill = await billedSetup({
    mock,
    prices: PRICES,
    accounts: [
      { name: 'up', credential: CRED, priority: 0, models: ['gpt-5-mini'] },
      { name: 'claude', provider: 'anthropic', base_url: `${mock.url}/v1`, credential: CRED, priority: 0, models: ['claude-x'] },
    ],
  });
  t = { bill, gw: await startBilledGateway(bill, { billing: { default_max_tokens: CAP } }, { mock }) };
});

after(async () => {
  await stopAll();
  await t?.bill.db.drop();
});

async function sent() {
  const last = await mock.last();
  return { raw: last.body, doc: JSON.parse(last.body) };
}

async function post(t, path, body, headers = {}) {
  const r = await fetch(`${t.gw.url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${t.bill.key}`, 'x-api-key': t.bill.key, 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: r.status, text: await r.text(), id: r.headers.get('x-request-id') };
}

async function bound(t, id) {
  return reservedBound(t.bill, id);
}

test('no limit, pass-through: the client\'s bytes go on with the cap added, and the cap is what was reserved', async () => {
  const client = '{"model":"gpt-5-mini", "messages":[{"role":"user","content":"caf\\u00e9 [mock chunks=2]"}],"temperature":0.5}';
  const r = await post(t, '/v1/chat/completions', client);
  assert.equal(r.status, 200, r.text);
  const { raw, doc } = await sent();
  assert.equal(doc.max_completion_tokens, CAP);
  assert.equal(doc.max_tokens, undefined);
  // Edited in place: the client's own spelling of every other member is kept.
  assert.ok(raw.includes('"content":"caf\\u00e9 [mock chunks=2]"'), raw);
  assert.ok(raw.includes('"temperature":0.5'), raw);
  assert.equal(await bound(t, r.id), reservationFor(Buffer.byteLength(client), CAP));
});

test('no limit, and "max_tokens" is a key deeper in the body: the cap at the top only, the nested key intact', async () => {
  const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { max_tokens: { type: 'integer' } } } } }];
  const body = { model: 'gpt-5-mini', tools, messages: [{ role: 'user', content: 'hi [mock chunks=1]' }] };
  const r = await post(t, '/v1/chat/completions', body);
  assert.equal(r.status, 200, r.text);
  const { doc } = await sent();
  assert.equal(doc.max_completion_tokens, CAP);
  assert.equal(doc.max_tokens, undefined);
  assert.deepEqual(doc.tools, tools);
});

test('no limit, translated for an Anthropic account: the tree built after the bound holds the cap', async () => {
  const body = { model: 'claude-x', messages: [{ role: 'user', content: 'hello [mock chunks=2]' }] };
  const r = await post(t, '/v1/chat/completions', body);
  assert.equal(r.status, 200, r.text);
  const { doc } = await sent();
  assert.equal(doc.max_tokens, CAP, 'Anthropic\'s max_tokens is billing\'s cap');
  assert.equal(await bound(t, r.id), reservationFor(Buffer.byteLength(JSON.stringify(body)), CAP));
});

test('a limit the scan reads as an integer is the bound; one it cannot (null, 1e2, a string) goes the tree\'s way', async () => {
  const m = [{ role: 'user', content: 'hi [mock chunks=1]' }];
  let r = await post(t, '/v1/chat/completions', { model: 'gpt-5-mini', max_completion_tokens: 37, messages: m });
  assert.equal(r.status, 200, r.text);
  assert.equal((await sent()).doc.max_completion_tokens, 37);
  assert.equal(await bound(t, r.id), reservationFor(Buffer.byteLength(JSON.stringify({ model: 'gpt-5-mini', max_completion_tokens: 37, messages: m })), 37));

  r = await post(t, '/v1/chat/completions', '{"model":"gpt-5-mini","max_tokens":1e2,"messages":[{"role":"user","content":"hi [mock chunks=1]"}]}');
  assert.equal(r.status, 200, r.text);
  assert.equal((await sent()).raw.includes('"max_tokens":100'), true, 'a whole number written as a real goes on as the integer');

  r = await post(t, '/v1/chat/completions', { model: 'gpt-5-mini', max_tokens: null, messages: m });
  assert.equal(r.status, 200, r.text);
  const { doc } = await sent();
  assert.equal(doc.max_completion_tokens, CAP, 'a null limit is no limit: the cap');
  assert.equal('max_tokens' in doc, false, 'and the null is not sent beside it');

  for (const [what, v] of [['zero', 0], ['negative', -5], ['a string', '"16"'], ['a fraction', 2.5]]) {
    const before = (await mock.stats()).total;
    r = await post(t, '/v1/chat/completions', `{"model":"gpt-5-mini","max_tokens":${v},"messages":[{"role":"user","content":"hi"}]}`);
    assert.equal(r.status, 400, `${what}: ${r.text}`);
    const err = JSON.parse(r.text).error;
    assert.equal(err.code, 'invalid_max_tokens', what);
    assert.match(err.message, /^max_tokens must be a positive integer/, what);
    assert.equal((await mock.stats()).total, before, `${what}: nothing reached the upstream`);
  }
});

test('Responses without a limit: max_output_tokens is the cap', async () => {
  const r = await post(t, '/v1/responses', { model: 'gpt-5-mini', input: 'hi [mock chunks=1]' });
  assert.equal(r.status, 200, r.text);
  const { doc } = await sent();
  assert.equal(doc.max_output_tokens, CAP);
});
