// AWS Bedrock accounts (issue #19, item 3): provider "bedrock", settings.region and
// settings.access_key_id, the credential the secret access key (":<session token>"
// appended when there is one), model_map the client's model -> the Bedrock modelId.
// Anthropic models through InvokeModel and InvokeModelWithResponseStream, SigV4-signed;
// the mock verifies each signature with its own key pair (--aws-key) and answers 403 on
// a mismatch or a stale date. The official openai (chat, Responses) and
// @anthropic-ai/sdk (Messages) clients, streamed and not: the text, usage in the
// client's shape, what Bedrock received, the usage row billed exactly; a stream's
// exception and a wrong secret as errors in the client's shape.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';

import { mockInputTokens, mockText, startMock, stopAll, waitFor } from './lib/harness.mjs';
import { billedSetup, startBilledGateway, waitUsageRow } from './lib/billing.mjs';

const MODEL = 'claude-sonnet';
const MODEL_ID = 'anthropic.claude-3-5-sonnet-20240620-v1:0';
const AKID = 'AKIDEXAMPLE';
const SECRET = 'wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY';
const TOKEN = 'FwoGZXIvYXdzEXAMPLE/session+token==';
let mock, bill, gw;

before(async () => {
  mock = await startMock({ args: ['--aws-key', `${AKID}:${SECRET}:${TOKEN}`] });
  bill = await billedSetup({
    mock,
    prices: [{ model: MODEL, input: '1.00', output: '2.00' }],
    accounts: [{
      name: 'up', provider: 'bedrock', base_url: mock.url, credential: `${SECRET}:${TOKEN}`,
      model_map: { [MODEL]: MODEL_ID }, settings: { region: 'us-east-1', access_key_id: AKID },
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

async function anthropic() {
  const { default: Anthropic } = await import('@anthropic-ai/sdk');
  return new Anthropic({ apiKey: bill.key, baseURL: gw.url, maxRetries: 0, timeout: 30000 });
}

/** What Bedrock last received, checked; returns its body. */
async function upstreamBedrock(stream) {
  const last = await mock.last();
  assert.equal(last.path, `/model/${encodeURIComponent(MODEL_ID)}/${stream ? 'invoke-with-response-stream' : 'invoke'}`);
  assert.match(last.headers.authorization,
    /^AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE\/\d{8}\/us-east-1\/bedrock\/aws4_request, SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, Signature=[0-9a-f]{64}$/);
  assert.equal(last.headers['x-amz-security-token'], TOKEN);
  assert.equal(last.headers['x-api-key'], undefined, 'no Anthropic key header');
  assert.ok(!JSON.stringify(last.headers).includes(SECRET), 'the secret never goes on the wire');
  const body = JSON.parse(last.body);
  assert.equal(body.anthropic_version, 'bedrock-2023-05-31');
  assert.equal(body.model, undefined, 'the modelId is in the path');
  assert.equal(body.stream, undefined, 'the operation says whether it streams');
  return body;
}

async function billed(id, { input, output }) {
  const row = await waitUsageRow(bill, id);
  assert.equal(Number(row.input_tokens), input);
  assert.equal(Number(row.output_tokens), output);
  assert.equal(row.cost, BigInt(input) * 1000n + BigInt(output) * 2000n);
  assert.equal(row.model, MODEL);
}

test('chat completions, not streamed and streamed: InvokeModel and the event stream, billed', async () => {
  const client = await openai();
  const text = 'hello bedrock [mock chunks=5]';
  const inTok = mockInputTokens({ messages: [{ content: text }] });
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: text }], max_tokens: 40 }).withResponse();
  assert.equal(r.data.choices[0].message.content, mockText(5));
  assert.equal(r.data.choices[0].finish_reason, 'stop');
  assert.equal(r.data.usage.prompt_tokens, inTok);
  assert.equal(r.data.usage.completion_tokens, 5);
  const body = await upstreamBedrock(false);
  assert.equal(body.max_tokens, 40);
  await billed(r.response.headers.get('x-request-id'), { input: inTok, output: 5 });

  const { data: stream, response } = await client.chat.completions
    .create({ model: MODEL, messages: [{ role: 'user', content: text }], stream: true, stream_options: { include_usage: true } })
    .withResponse();
  assert.equal(response.headers.get('content-type'), 'text/event-stream');
  let got = '', finish = null, usage = null;
  for await (const ch of stream) {
    got += ch.choices[0]?.delta?.content ?? '';
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
    if (ch.usage) usage = ch.usage;
  }
  assert.equal(got, mockText(5));
  assert.equal(finish, 'stop');
  assert.equal(usage.prompt_tokens, inTok);
  assert.equal(usage.completion_tokens, 5);
  await upstreamBedrock(true);
  await billed(response.headers.get('x-request-id'), { input: inTok, output: 5 });
});

test('Anthropic Messages, not streamed and streamed (the events as Bedrock carried them)', async () => {
  const client = await anthropic();
  const text = 'from claude code [mock chunks=4]';
  const inTok = mockInputTokens({ messages: [{ content: text }] });
  const { data: msg, response } = await client.messages
    .create({ model: MODEL, max_tokens: 100, system: 'Be brief.', messages: [{ role: 'user', content: text }] })
    .withResponse();
  assert.equal(msg.content[0].text, mockText(4));
  assert.equal(msg.stop_reason, 'end_turn');
  const both = mockInputTokens({ messages: [{ content: text }], system: 'Be brief.' });
  assert.equal(msg.usage.input_tokens, both);
  assert.equal(msg.usage.output_tokens, 4);
  const body = await upstreamBedrock(false);
  assert.equal(body.system, 'Be brief.');
  await billed(response.headers.get('x-request-id'), { input: both, output: 4 });

  const s = client.messages.stream({ model: MODEL, max_tokens: 3, messages: [{ role: 'user', content: text }] });
  let got = '';
  s.on('text', (t) => { got += t; });
  const final = await s.finalMessage();
  assert.equal(got, mockText(3), 'max_tokens reached Bedrock');
  assert.equal(final.usage.output_tokens, 3);
  assert.equal(final.usage.input_tokens, inTok);
  assert.equal((await upstreamBedrock(true)).max_tokens, 3);
  const id = (await s.withResponse()).response.headers.get('x-request-id');
  await billed(id, { input: inTok, output: 3 });
});

test('OpenAI Responses, not streamed and streamed', async () => {
  const client = await openai();
  const r = await client.responses.create({ model: MODEL, instructions: 'Be kind.', input: 'hi there [mock chunks=3]' });
  assert.equal(r.status, 'completed');
  assert.equal(r.output_text, mockText(3));
  assert.equal(r.usage.output_tokens, 3);
  assert.equal((await upstreamBedrock(false)).system, 'Be kind.');

  const s = await client.responses.create({ model: MODEL, input: 'again [mock chunks=2]', stream: true });
  let got = '', done = null;
  for await (const ev of s) {
    if (ev.type === 'response.output_text.delta') got += ev.delta;
    if (ev.type === 'response.completed') done = ev.response;
  }
  assert.equal(got, mockText(2));
  assert.equal(done.usage.output_tokens, 2);
  await upstreamBedrock(true);
});

test('without usage in the events, the invocation metrics are billed, and the client\'s usage chunk shows them', async () => {
  const client = await openai();
  const text = 'metrics only [mock chunks=6 usage=0]';
  const { data: stream, response } = await client.chat.completions
    .create({ model: MODEL, messages: [{ role: 'user', content: text }], stream: true, stream_options: { include_usage: true } })
    .withResponse();
  let got = '';
  let usage = null;
  for await (const ch of stream) {
    got += ch.choices[0]?.delta?.content ?? '';
    if (ch.usage) usage = ch.usage;
  }
  assert.equal(got, mockText(6));
  const input = mockInputTokens({ messages: [{ content: text }] });
  await billed(response.headers.get('x-request-id'), { input, output: 6 });
  assert.deepEqual([usage?.prompt_tokens, usage?.completion_tokens], [input, 6], 'the usage chunk is the bill');
});

test("a stream's exception reaches each client as an error in its shape", async () => {
  const oa = await openai();
  const stream = await oa.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x [mock aws_exception=2]' }], stream: true });
  let got = '';
  await assert.rejects(async () => {
    for await (const ch of stream) got += ch.choices[0]?.delta?.content ?? '';
  }, (e) => /throttlingException: mock: Too many requests/.test(e.message));
  assert.equal(got, mockText(2), 'the text before the exception arrived');

  const an = await anthropic();
  const s = an.messages.stream({ model: MODEL, max_tokens: 50, messages: [{ role: 'user', content: 'x [mock aws_exception=1]' }] });
  await assert.rejects(s.finalMessage(), (e) => e.error?.error?.type === 'rate_limit_error' && /throttlingException/.test(e.message));
});

test('a Bedrock error answer reaches the client in its shape', async () => {
  const oa = await openai();
  await assert.rejects(
    oa.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x [mock status=400]' }] }),
    (e) => e.status === 400 && /injected error/.test(e.message),
  );
  const an = await anthropic();
  await assert.rejects(
    an.messages.create({ model: MODEL, max_tokens: 10, messages: [{ role: 'user', content: 'x [mock status=400]' }] }),
    (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error' && /injected error/.test(e.message),
  );
});

// The mock checks signatures for real: one made here, independently of the gateway.
function sign({ date, secret = SECRET, body = '{}' }) {
  const path = `/model/${encodeURIComponent(MODEL_ID)}/invoke`;
  const host = new URL(mock.url).host;
  const canonUri = path.split('/').map((s) => encodeURIComponent(s).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)).join('/');
  const sha = (x) => crypto.createHash('sha256').update(x).digest('hex');
  const hmac = (k, x) => crypto.createHmac('sha256', k).update(x).digest();
  const headers = `content-type:application/json\nhost:${host}\nx-amz-date:${date}\nx-amz-security-token:${TOKEN}\n`;
  const signed = 'content-type;host;x-amz-date;x-amz-security-token';
  const cr = `POST\n${canonUri}\n\n${headers}\n${signed}\n${sha(body)}`;
  const scope = `${date.slice(0, 8)}/us-east-1/bedrock/aws4_request`;
  const sts = `AWS4-HMAC-SHA256\n${date}\n${scope}\n${sha(cr)}`;
  let k = hmac(`AWS4${secret}`, date.slice(0, 8));
  for (const p of ['us-east-1', 'bedrock', 'aws4_request']) k = hmac(k, p);
  const sig = crypto.createHmac('sha256', k).update(sts).digest('hex');
  return fetch(mock.url + path, {
    method: 'POST',
    body,
    headers: {
      'content-type': 'application/json', 'x-amz-date': date, 'x-amz-security-token': TOKEN,
      authorization: `AWS4-HMAC-SHA256 Credential=${AKID}/${scope}, SignedHeaders=${signed}, Signature=${sig}`,
    },
  });
}
const amzDate = (ms) => new Date(ms).toISOString().replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z');

test('the mock verifies SigV4: a good signature, a wrong secret, a stale date', async () => {
  const body = JSON.stringify({ anthropic_version: 'bedrock-2023-05-31', max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] });
  const ok = await sign({ date: amzDate(Date.now()), body });
  assert.equal(ok.status, 200, await ok.clone().text());
  assert.equal((await ok.json()).content[0].text, mockText(5));
  const bad = await sign({ date: amzDate(Date.now()), secret: 'not-the-secret', body });
  assert.equal(bad.status, 403);
  assert.match(bad.headers.get('x-amzn-errortype'), /^InvalidSignatureException/);
  assert.match((await bad.json()).message, /signature we calculated does not match/);
  const stale = await sign({ date: amzDate(Date.now() - 6 * 60 * 1000), body });
  assert.equal(stale.status, 403);
  assert.match((await stale.json()).message, /Signature expired/);
});

async function admin(method, path, body) {
  const r = await fetch(`${gw.url}/admin/api/v1${path}`, {
    method,
    headers: { authorization: 'Bearer adm-test', 'content-type': 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  });
  return { status: r.status, body: await r.json().catch(() => null) };
}

test('settings without a region are refused by the admin API', async () => {
  const r = await admin('POST', '/accounts', { name: 'bad', provider: 'bedrock', base_url: mock.url, credential: 's', settings: { access_key_id: AKID } });
  assert.equal(r.status, 400, JSON.stringify(r.body));
  assert.match(r.body.error.message, /region/);
});

test("the admin API's account test signs its InvokeModel call", async () => {
  const r = await admin('POST', `/accounts/${bill.accountId}/test`, {});
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.ok, true, JSON.stringify(r.body));
  assert.equal(r.body.upstream_model, MODEL_ID);
  assert.equal(r.body.path, `/model/${encodeURIComponent(MODEL_ID)}/invoke`);
  assert.equal(r.body.reply, mockText(8));
  await upstreamBedrock(false);
});

// Last: the account's failed calls cool it down.
test('a wrong secret: a clear 403 in the client shape; the account is written without echoing it', async () => {
  const r = await admin('PATCH', `/accounts/${bill.accountId}`, { credential: `wrong-secret-0000:${TOKEN}` });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  assert.equal(r.body.credential, undefined, 'credentials are write-only');
  const oa = await openai();
  let last;
  await waitFor(async () => {
    last = await oa.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }] }).then(() => null, (e) => e);
    return last?.status === 403;
  }, { timeout: 10000, what: 'the wrong secret in use' });
  assert.match(last.message, /signature we calculated does not match the signature you provided\. Check your AWS Secret Access Key/);
  assert.equal(last.error?.type, 'permission_error');
  const t = await admin('POST', `/accounts/${bill.accountId}/test`, {});
  assert.equal(t.body.ok, false);
  assert.equal(t.body.status, 403);
  assert.match(t.body.error.message, /signature we calculated does not match/);
});
