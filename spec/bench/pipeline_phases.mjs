// Where a streamed request's time before its upstream call goes, from its own spans
// (core/README.md, Traces): pipeline_bench.sh --phases keeps each OTLP/JSON export its
// receiver got in DIR; this reads the traces of SERVICE (a target's service.name) and
// prints one line: the streams traced, then the p50 in milliseconds of each phase —
// first byte → account selection (the sticky lookup before the router hook), selection →
// admission sent, the admission (its script handed to the Redis client → answer read),
// answer → upstream call — then first byte → upstream call at p50 and p90. A phase a
// request does not have (the static key has no selection or admission) is skipped and its
// time counted in the next one; a phase no request has prints "-".
//
//   node spec/bench/pipeline_phases.mjs DIR SERVICE
import { readdirSync, readFileSync } from 'node:fs';

const [dir, want] = process.argv.slice(2);
if (!dir || !want) {
  console.error('usage: node pipeline_phases.mjs DIR SERVICE');
  process.exit(2);
}

const traces = new Map();
for (const f of readdirSync(dir)) {
  const doc = JSON.parse(readFileSync(`${dir}/${f}`, 'utf8'));
  for (const rs of doc.resourceSpans ?? []) {
    const svc = (rs.resource?.attributes ?? []).find((a) => a.key === 'service.name')?.value?.stringValue;
    if (svc !== want) continue;
    for (const ss of rs.scopeSpans ?? []) {
      for (const sp of ss.spans ?? []) {
        if (!traces.has(sp.traceId)) traces.set(sp.traceId, []);
        traces.get(sp.traceId).push(sp);
      }
    }
  }
}

const start = (s) => Number(BigInt(s.startTimeUnixNano) / 1000n); // µs
const end = (s) => Number(BigInt(s.endTimeUnixNano) / 1000n);
const earliest = (spans) => spans.sort((a, b) => start(a) - start(b))[0];
const SERVER = 2;
const CLIENT = 3;

const phases = [[], [], [], []];
const total = [];
for (const spans of traces.values()) {
  const server = spans.find((s) => s.kind === SERVER);
  if (!server?.attributes?.some((a) => a.key === 'tollgate.stream' && a.value?.boolValue)) continue;
  const upstream = earliest(spans.filter((s) => s.kind === CLIENT));
  if (!upstream) continue;
  const admission = spans.find((s) => s.name === 'admission');
  const select = earliest(spans.filter((s) => s.name === 'select account'));
  // The request in order: its first byte, the selection begins, the admission is sent,
  // its answer read, the upstream call starts.
  const marks = [start(server), select ? start(select) : null, admission ? start(admission) : null,
    admission ? end(admission) : null, start(upstream)];
  let prev = marks[0];
  for (let i = 1; i < marks.length; i++) {
    if (marks[i] === null) continue;
    phases[i - 1].push(marks[i] - prev);
    prev = marks[i];
  }
  total.push(marks[4] - marks[0]);
}

const pct = (v, p) => {
  if (!v.length) return '-';
  v.sort((a, b) => a - b);
  return (v[Math.min(v.length - 1, Math.ceil((p / 100) * v.length) - 1)] / 1000).toFixed(3);
};
console.log([total.length, ...phases.map((v) => pct(v, 50)), pct(total, 50), pct(total, 90)].join(' '));
