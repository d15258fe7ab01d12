// scale (#21, item 4): a zero-downtime rolling restart. Three gateway instances on
// loopback behind HAProxy with examples/fleet/haproxy.cfg (health checks on /readyz),
// each with limits.drain_delay_ms = 1000; six clients (the official OpenAI SDK, streams
// and plain answers) send requests through the balancer back to back while
// examples/fleet/rolling-restart.sh restarts the instances one after the other. Not one
// request fails, every instance is a new process afterwards, and the upstream saw
// exactly the requests the clients got answers for (nothing sent twice). Skipped (77)
// without haproxy (spec/install-deps.sh installs it).

import assert from 'node:assert/strict';
import { execFile, spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { CLIENT_KEY, HOST, REPO, TG_BIN, UPSTREAM_KEY, fetchT, freePort, sleep, startMock, stopAll, tempDir, toLua, waitFor } from './lib/harness.mjs';
import { tally } from './lib/db.mjs';

if (spawnSync('haproxy', ['-v']).status !== 0) {
  console.log('skipped: no haproxy (spec/install-deps.sh installs it)');
  process.exit(77);
}

const GW = path.join(REPO, 'spec/lib/fleet_gw.sh');
const NAMES = ['gw1', 'gw2', 'gw3'];
let mock;
let dir;
let lb;
let lbUrl;
const ports = {};
// The gateways are the script's (as systemd's would be): no suite services for them.
const env = { ...process.env, TG_BIN, TOLLGATE_PG: '', TOLLGATE_REDIS: '' };
delete env.TOLLGATE_PG;
delete env.TOLLGATE_REDIS;

function run(cmd, args, extraEnv = {}) {
  return new Promise((resolve) => {
    execFile(cmd, args, { env: { ...env, ...extraEnv }, timeout: 120000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr });
    });
  });
}

const pidOf = (name) => fs.readFileSync(path.join(dir, `${name}.pid`), 'utf8').trim();
const log = (name) => (fs.existsSync(path.join(dir, `${name}.log`)) ? fs.readFileSync(path.join(dir, `${name}.log`), 'utf8') : '');

before(async () => {
  mock = await startMock();
  dir = tempDir('fleet');
  for (const name of NAMES) {
    ports[name] = await freePort();
    const cfg = {
      listen: `${HOST}:${ports[name]}`,
      workers: 1,
      keys: [CLIENT_KEY],
      access_log: false,
      upstream: { url: `${mock.url}/v1`, api_key: UPSTREAM_KEY },
      limits: { drain_delay_ms: 1000, shutdown_timeout_ms: 10000 },
    };
    fs.writeFileSync(path.join(dir, `${name}.lua`), `return ${toLua(cfg)}\n`);
    const r = await run(GW, ['start', name, dir]);
    assert.equal(r.code, 0, r.stderr);
  }
  for (const name of NAMES) {
    await waitFor(async () => (await fetchT(`http://${HOST}:${ports[name]}/readyz`, {}, 1000).catch(() => ({}))).status === 200,
      { timeout: 15000, what: `${name} ready` });
  }
  const lbPort = await freePort();
  lbUrl = `http://${HOST}:${lbPort}`;
  lb = spawn('haproxy', ['-db', '-f', path.join(REPO, 'examples/fleet/haproxy.cfg')], {
    env: { ...env, TG_LB_BIND: `${HOST}:${lbPort}`, TG_GW1: `${HOST}:${ports.gw1}`, TG_GW2: `${HOST}:${ports.gw2}`, TG_GW3: `${HOST}:${ports.gw3}` },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  lb.stderrText = '';
  lb.stderr.on('data', (d) => { lb.stderrText += d; });
  await waitFor(async () => (await fetchT(`${lbUrl}/readyz`, {}, 1000).catch(() => ({}))).status === 200,
    { timeout: 10000, what: 'haproxy' });
  await sleep(800); // every server's first checks (rise 2 × 250 ms)
});

after(async () => {
  if (lb && lb.exitCode === null) {
    lb.kill('SIGTERM');
    await new Promise((resolve) => lb.on('exit', resolve));
  }
  if (dir) for (const name of NAMES) await run(GW, ['stop', name, dir]);
  await stopAll();
});

/** Clients through the balancer until stop(): every other request a stream. */
async function load(clients) {
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ apiKey: CLIENT_KEY, baseURL: `${lbUrl}/v1`, maxRetries: 0, timeout: 20000 });
  const results = [];
  let running = true;
  const loops = Array.from({ length: clients }, async (_, c) => {
    for (let i = 0; running; i++) {
      const stream = (i + c) % 2 === 0;
      const body = { model: 'mock-gpt', messages: [{ role: 'user', content: 'roll [mock chunks=6 interval_ms=40]' }] };
      try {
        if (stream) {
          let text = '';
          for await (const ch of await client.chat.completions.create({ ...body, stream: true })) text += ch.choices[0]?.delta?.content ?? '';
          results.push({ ok: text === 'tok1 tok2 tok3 tok4 tok5 tok6 ', what: `stream: ${JSON.stringify(text)}` });
        } else {
          const r = await client.chat.completions.create(body);
          results.push({ ok: r.choices[0].message.content === 'tok1 tok2 tok3 tok4 tok5 tok6 ', what: 'answer' });
        }
      } catch (e) {
        results.push({ ok: false, what: `${e.status ?? ''} ${e.message}` });
        await sleep(20);
      }
    }
  });
  return {
    results,
    async stop() {
      running = false;
      await Promise.all(loops);
      return results;
    },
  };
}

test('rolling restart of three instances behind HAProxy under load: zero failed requests', async () => {
  const before = (await mock.stats()).total;
  const pids = Object.fromEntries(NAMES.map((n) => [n, pidOf(n)]));
  const l = await load(6);
  await sleep(800);
  const r = await run(path.join(REPO, 'examples/fleet/rolling-restart.sh'), NAMES.map((n) => `${n}=${HOST}:${ports[n]}`), {
    TG_RESTART_CMD: `${GW} restart %s ${dir}`,
    TG_LB_RISE_MS: '750',
  });
  assert.equal(r.code, 0, `${r.stdout}${r.stderr}`);
  await sleep(500);
  const results = await l.stop();

  const failed = results.filter((x) => !x.ok);
  assert.deepEqual(tally(failed.map((x) => x.what)), {}, `no request failed (${results.length} sent)\n${r.stdout}\n${lb.stderrText.slice(-2000)}`);
  assert.ok(results.length >= 60, `the load ran throughout (${results.length} requests)`);
  for (const n of NAMES) {
    assert.notEqual(pidOf(n), pids[n], `${n} is a new process`);
    assert.match(log(n), /drain delay over/, `${n} drained before it stopped`);
  }
  assert.equal((await mock.stats()).total - before, results.length, 'the upstream saw each answered request once');
});
