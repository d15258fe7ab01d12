// Cache locality (#20, item 5): a conversation is also bound by Anthropic's
// metadata.user_id, by the prefix a client marked with cache_control (system and marked
// messages), and by the Responses API's prompt_cache_key — across two gateway
// instances, under concurrency. Three equal accounts; for each key, a first wave of 6
// concurrent requests (spread over both instances: the first answer binds, SET NX, so
// the wave converges) and then a second wave of 12 concurrent requests that must all
// reach one account (counted at the mock). The official SDKs make the requests. The
// sticky hit ratio is in /metrics.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { MODEL, diff, startRouting } from './lib/routing.mjs';

let rt;
let gw2;
const clients = {};

before(async () => {
  rt = await startRouting({ accounts: [{ name: 'a' }, { name: 'b' }, { name: 'c' }] });
  gw2 = await rt.another();
  const { default: OpenAI } = await import('openai');
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  for (const [i, g] of [rt.gw, gw2].entries()) {
    clients[i] = {
      openai: new OpenAI({ apiKey: rt.key, baseURL: `${g.url}/v1`, maxRetries: 0, timeout: 30000 }),
      anthropic: new Anthropic({ apiKey: rt.key, baseURL: g.url, maxRetries: 0, timeout: 30000 }),
    };
  }
});

after(() => rt?.stop());

async function wave(n, send) {
  await Promise.all(Array.from({ length: n }, (_, i) => send(clients[i % 2], i)));
}

async function sticks(what, send) {
  await wave(6, send);
  const before = await rt.counts();
  await wave(12, send);
  const n = diff(await rt.counts(), before);
  const used = Object.entries(n).filter(([, v]) => v > 0);
  assert.equal(used.length, 1, `${what}: 12 concurrent requests over two instances reached ${JSON.stringify(n)}`);
}

test('Anthropic metadata.user_id binds', async () => {
  await sticks('metadata.user_id', (c, i) =>
    c.anthropic.messages.create({
      model: MODEL,
      max_tokens: 16,
      metadata: { user_id: 'user-7f3a' },
      messages: [{ role: 'user', content: `question ${i} [mock chunks=1]` }],
    }));
});

test('the cache_control-marked prefix binds (system and marked messages)', async () => {
  const system = [{ type: 'text', text: 'a long shared system prompt '.repeat(20), cache_control: { type: 'ephemeral' } }];
  const doc = { type: 'text', text: 'the shared document', cache_control: { type: 'ephemeral' } };
  // One message: the marked document, then a question that differs every time (the
  // first-two-messages rule needs three messages; nothing else binds these).
  await sticks('cache_control prefix', (c, i) =>
    c.anthropic.messages.create({
      model: MODEL,
      max_tokens: 16,
      system,
      messages: [{ role: 'user', content: [doc, { type: 'text', text: `question ${i} [mock chunks=1]` }] }],
    }));
});

test('the Responses API\'s prompt_cache_key binds', async () => {
  await sticks('prompt_cache_key', (c, i) =>
    c.openai.responses.create({ model: MODEL, prompt_cache_key: 'tenant-42-agent', input: `question ${i} [mock chunks=1]` }));
});

test('the sticky hit ratio is in /metrics', async () => {
  for (const g of [rt.gw, gw2]) {
    const text = await (await fetch(`${g.url}/metrics`)).text();
    const bound = Number(text.match(/^tollgate_sticky_bound_total (\d+)$/m)?.[1]);
    const hits = Number(text.match(/^tollgate_sticky_hits_total (\d+)$/m)?.[1]);
    const ratio = Number(text.match(/^tollgate_sticky_hit_ratio ([0-9.]+)$/m)?.[1]);
    assert.ok(bound >= 18 && hits >= 18 && ratio > 0.5 && ratio <= 1, `bound ${bound}, hits ${hits}, ratio ${ratio}`);
  }
});
