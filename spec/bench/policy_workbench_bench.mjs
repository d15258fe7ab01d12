// Driver of policy_workbench_bench.sh (see there): two gateway instances (A, B) on one
// Postgres and Redis, each with its own plugins.store, the shipped router and
// retry-budget enabled (so a reload validates a realistic generation), and a stored
// policy live for the `pool` group. Each round uploads a new source (a new version
// string) alternately on A and B and measures, at the client:
//   write   — the PUT's answer: validation, the Postgres transaction, this instance's
//             sync (write + reload); it answers once it serves the new generation;
//   remote  — from the PUT's start until the other instance serves it (its plugin
//             generation moved, read from x-tollgate-generation of a request of `pool`);
//   reload  — the other instance's own reload (its GET plugins last_reload), for scale.
// Prints one Markdown table (median, p90, max over the rounds, ms).
import path from 'node:path';

import { REPO, startMock, stopAll, tempDir } from '../integration/lib/harness.mjs';
import { adminClient, applyState, chat, chatReq, createDb, plainKey, startStateGateway } from '../integration/lib/db.mjs';

const ROUNDS = Number(process.env.TG_BENCH_N || 20);
const MODEL = 'gpt-4o-mini';

const src = (v) => `return {
  name = "bench-pick", priority = 800, version = "${v}",
  select_account = function(ctx, conf)
    local best, score = nil, -1
    for i = 1, ctx:naccounts() do
      local a = ctx:account(i)
      local s = (a.max_concurrency - a.inflight) / (1 + a.error_ewma)
      if s > score then best, score = i, s end
    end
    if best then ctx:select(best) end
  end,
}
`;

const q = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};

const mock = await startMock();
const db = await createDb();
const key = plainKey('wb');
await applyState(db, {
  tenants: [{ name: 'wb', balance: '1000' }],
  groups: [{ name: 'pool', models: [] }],
  accounts: ['a', 'b', 'c'].map((n) => ({ name: n, provider: 'openai', base_url: `${mock.url}/v1`, credential: `sk-${n}`, concurrency: 16, groups: ['pool'] })),
  keys: [{ name: 'wb', tenant: 'wb', group: 'pool', key }],
  prices: [{ model: MODEL, input: '0.15', output: '0.60' }],
});
const config = (store) => ({
  workers: 2,
  plugins: { dirs: [path.join(REPO, 'plugins')], store, watch: false, enabled: [{ name: 'router' }, { name: 'retry-budget' }] },
});
const gws = [await startStateGateway(db, config(path.join(tempDir('sa'), 'p')), { mock }),
  await startStateGateway(db, config(path.join(tempDir('sb'), 'p')), { mock })];
const admins = gws.map((g) => adminClient(g));
const gen = async (g) => Number((await chat(g, key, chatReq(MODEL, 'x [mock chunks=1]'))).headers['x-tollgate-generation']);
for (const g of gws) {
  for (let i = 0; i < 100 && !(await gen(g)); i++) await new Promise((r) => setTimeout(r, 100));
}
const groupId = (await admins[0].read('/groups')).data[0].id;
let r = await admins[0].call('PUT', '/policies/bench-pick', { source: src('0') });
if (r.status !== 200) throw new Error(r.text);
r = await admins[0].post('/policies/bench-pick/promote', { group_id: groupId });
if (r.status !== 200) throw new Error(r.text);

const write = [];
const remote = [];
const reload = [];
let failed = 0;
for (let i = 1; i <= ROUNDS; i++) {
  const w = i % 2;
  const other = gws[1 - w];
  const before = await gen(other);
  const t0 = performance.now();
  const put = await admins[w].call('PUT', '/policies/bench-pick', { source: src(String(i)) });
  const t1 = performance.now();
  if (put.status !== 200) throw new Error(put.text);
  let seen;
  for (;;) {
    const res = await chat(other, key, chatReq(MODEL, 'x [mock chunks=1]'));
    if (res.status !== 200) failed++;
    if (Number(res.headers['x-tollgate-generation']) > before) {
      seen = performance.now();
      break;
    }
    if (performance.now() - t0 > 20000) throw new Error('the other instance did not load the change in 20 s');
  }
  write.push(t1 - t0);
  remote.push(seen - t0);
  const st = await admins[1 - w].read('/plugins');
  reload.push(st.last_reload.trigger);
}
const row = (name, xs, what) => `| ${name} | ${q(xs, 0.5).toFixed(1)} | ${q(xs, 0.9).toFixed(1)} | ${Math.max(...xs).toFixed(1)} | ${what} |`;
console.log(`${ROUNDS} generation changes, alternately on A and B; ${failed} requests to the other instance failed meanwhile`);
console.log('');
console.log('| measured | median ms | p90 ms | max ms | what |');
console.log('|---|---:|---:|---:|---|');
console.log(row('write (PUT answered)', write, 'validate, Postgres transaction, this instance written and reloaded'));
console.log(row('remote (other serves it)', remote, 'from the PUT\'s start until a request of the other instance carries the new generation'));
console.log(row('remote − write', remote.map((x, k) => x - write[k]), 'Redis message, the other\'s sync query, file write, reload'));
console.log('');
console.log(`the other instance's reload trigger: ${[...new Set(reload)].join(', ')}`);
await stopAll();
await db.drop();
