// Issue #15, item 8: with billing on, a chat request without an output limit gets
// billing.default_max_tokens, and the upstream receives it under the field its model
// family accepts: max_completion_tokens for OpenAI (the o-series and the gpt-5 family
// refuse max_tokens), max_tokens for the models of `max_tokens_models`. The bound
// reserved is the bound the upstream receives, whatever the spelling. A translated cap
// (an Anthropic client's max_tokens) follows the same rule.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { startMock, stopAll } from './lib/harness.mjs';
import { chat } from './lib/db.mjs';
import { billedSetup, reservationFor, reservedBound, startBilledGateway } from './lib/billing.mjs';

const DEFAULT_CAP = 3000;
let mock;
let bill;
let gw;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({
    mock,
    prices: [
      { model: 'gpt-5-mini', input: '1.00', output: '2.00' },
      { model: 'legacy-chat', input: '1.00', output: '2.00' },
    ],
  });
  gw = await startBilledGateway(bill, { max_tokens_models: ['legacy-*'], billing: { default_max_tokens: DEFAULT_CAP } }, { mock });
});

after(async () => {
  await stopAll();
  await bill?.db.drop();
});

async function upstreamBody() {
  return JSON.parse((await mock.last()).body);
}

for (const [model, field, other] of [
  ['gpt-5-mini', 'max_completion_tokens', 'max_tokens'],
  ['legacy-chat', 'max_tokens', 'max_completion_tokens'],
]) {
  test(`a chat request without a limit to ${model}: ${field} reaches the upstream, and is what was reserved`, async () => {
    const body = { model, messages: [{ role: 'user', content: 'hello [mock chunks=2]' }] };
    const r = await chat(gw, bill.key, body);
    assert.equal(r.status, 200, r.text);
    const got = await upstreamBody();
    assert.equal(got[field], DEFAULT_CAP, `the upstream got ${field}`);
    assert.equal(got[other], undefined, `and no ${other}`);
    const id = r.headers['x-request-id'];
    assert.equal(await reservedBound(bill, id), reservationFor(Buffer.byteLength(JSON.stringify(body)), DEFAULT_CAP), 'the bound reserved');
  });
}

test('a client that spelled its own limit is passed through as spelled', async () => {
  const r = await chat(gw, bill.key, { model: 'gpt-5-mini', max_completion_tokens: 50, messages: [{ role: 'user', content: 'hi [mock chunks=1]' }] });
  assert.equal(r.status, 200, r.text);
  const got = await upstreamBody();
  assert.equal(got.max_completion_tokens, 50);
  assert.equal(got.max_tokens, undefined);
});

test('an Anthropic client of an OpenAI account: its max_tokens is spelled for the model', async () => {
  for (const [model, field, other] of [['gpt-5-mini', 'max_completion_tokens', 'max_tokens'], ['legacy-chat', 'max_tokens', 'max_completion_tokens']]) {
    const r = await fetch(`${gw.url}/v1/messages`, {
      method: 'POST',
      headers: { 'x-api-key': bill.key, 'content-type': 'application/json' },
      body: JSON.stringify({ model, max_tokens: 40, messages: [{ role: 'user', content: 'hi [mock chunks=1]' }] }),
    });
    assert.equal(r.status, 200, await r.text());
    const got = await upstreamBody();
    assert.equal(got[field], 40, `${model}: ${field}`);
    assert.equal(got[other], undefined, `${model}: no ${other}`);
  }
});
