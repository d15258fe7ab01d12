// Azure OpenAI accounts (issue #19, item 2): provider "azure", base_url the resource's
// ".../openai", model_map the client's model -> the deployment, settings.api_version
// (default 2024-10-21), the key in api-key. The official openai client (chat, streamed
// and not; embeddings) and @anthropic-ai/sdk (translated to chat) against it; what the
// upstream received (deployment path, api-version, api-key, never the client's key)
// and the usage row billed.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';

import { mockInputTokens, mockText, startMock, stopAll } from './lib/harness.mjs';
import { billedSetup, startBilledGateway, waitUsageRow } from './lib/billing.mjs';

const KEY = 'az-test-key-1';
let mock, bill, gw;

before(async () => {
  mock = await startMock();
  bill = await billedSetup({
    mock,
    prices: [{ model: 'gpt-4o', input: '1.00', output: '2.00' }, { model: 'text-embedding-3-small', input: '1.00', output: '0' }],
    accounts: [{
      name: 'up', provider: 'azure', base_url: `${mock.url}/openai`, credential: KEY,
      model_map: { 'gpt-4o': 'prod-gpt4o', 'text-embedding-3-small': 'emb-small' },
      settings: { api_version: '2025-01-01-preview' },
    }],
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

async function upstreamAzure(deployment, op = 'chat/completions') {
  const last = await mock.last();
  assert.equal(last.path, `/openai/deployments/${deployment}/${op}?api-version=2025-01-01-preview`);
  assert.equal(last.headers['api-key'], KEY);
  assert.equal(last.headers.authorization, undefined, 'the client key never goes upstream');
  return JSON.parse(last.body);
}

test('chat completions through a deployment, not streamed and streamed, billed', async () => {
  const client = await openai();
  const text = 'hello azure [mock chunks=4]';
  const r = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: text }] }).withResponse();
  assert.equal(r.data.choices[0].message.content, mockText(4));
  assert.equal(r.data.usage.completion_tokens, 4);
  await upstreamAzure('prod-gpt4o');
  const row = await waitUsageRow(bill, r.response.headers.get('x-request-id'));
  const inTok = mockInputTokens({ messages: [{ content: text }] });
  assert.equal(Number(row.input_tokens), inTok);
  assert.equal(Number(row.output_tokens), 4);
  assert.equal(row.cost, BigInt(inTok) * 1000n + 4n * 2000n);

  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: text }], stream: true });
  let got = '';
  for await (const ch of stream) got += ch.choices[0]?.delta?.content ?? '';
  assert.equal(got, mockText(4));
  const body = await upstreamAzure('prod-gpt4o');
  assert.equal(body.stream, true);
  assert.deepEqual(body.stream_options, { include_usage: true }, 'the usage chunk is asked for (billing)');
});

test('an Anthropic client is translated to chat completions on the deployment', async () => {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  const client = new Anthropic({ apiKey: bill.key, baseURL: gw.url, maxRetries: 0, timeout: 30000 });
  const msg = await client.messages.create({ model: 'gpt-4o', max_tokens: 50, messages: [{ role: 'user', content: 'hi [mock chunks=3]' }] });
  assert.equal(msg.content[0].text, mockText(3));
  assert.equal(msg.stop_reason, 'end_turn');
  const body = await upstreamAzure('prod-gpt4o');
  assert.equal(body.max_completion_tokens, 50);
});

test('embeddings go to the embeddings deployment', async () => {
  const client = await openai();
  const e = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'abc' });
  assert.equal(e.data.length, 1);
  await upstreamAzure('emb-small', 'embeddings');
});

test('the models list is the deployments the account maps', async () => {
  const client = await openai();
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids.sort(), ['gpt-4o', 'text-embedding-3-small']);
});

test('a bad api_version setting is refused by the admin API', async () => {
  const r = await fetch(`${gw.url}/admin/api/v1/accounts`, {
    method: 'POST',
    headers: { authorization: 'Bearer adm-test', 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'bad', provider: 'azure', base_url: `${mock.url}/openai`, credential: 'k', settings: { api_version: 'a b\r\nX: y' } }),
  });
  assert.equal(r.status, 400, await r.text());
});
