// Live traffic: GET /metrics polled every two seconds (requests/s, error share, p50/p95
// time to first token) and spend per hour from the usage summary.
import { useEffect, useMemo, useState } from 'preact/hooks';

import { api, fetchMetrics, listAll } from '../api.js';
import { Chart } from '../chart.jsx';
import { Empty, ErrorBox, PageHead, Spinner } from '../components.jsx';
import { Guide } from '../guide.jsx';
import { money, ms, num } from '../format.js';
import { parsePrometheus, ratePoint, refusalRows, summarize } from '../metrics.js';
import { REASONS, RefusalsTable } from '../refusals.jsx';

const POLL_MS = 2000;
const KEEP = 300;       // samples kept: 10 minutes
const RATE_SPAN = 5;    // requests/s and errors over the last 5 samples (10 s)
const TTFT_SPAN = 15;   // TTFT percentiles over the last 15 samples (30 s)
const SPEND_POLL_MS = 15000;

// Kept between visits to the page, so coming back shows the recent past.
const samples = [];

function pushSample(s) {
  const last = samples[samples.length - 1];
  if (last && s.requests < last.requests) samples.length = 0; // the gateway restarted
  samples.push(s);
  if (samples.length > KEEP) samples.splice(0, samples.length - KEEP);
}

function series() {
  const xs = [];
  const rps = [];
  const err = [];
  const err5 = [];
  const p50 = [];
  const p95 = [];
  for (let i = 1; i < samples.length; i++) {
    const r = ratePoint(samples[Math.max(0, i - RATE_SPAN)], samples[i]);
    const t = ratePoint(samples[Math.max(0, i - TTFT_SPAN)], samples[i]);
    if (!r || !t) continue;
    xs.push(samples[i].t / 1000);
    rps.push(r.rps);
    err.push(r.errorPct);
    err5.push(r.serverErrorPct);
    p50.push(t.p50ms);
    p95.push(t.p95ms);
  }
  return { xs, rps, err, err5, p50, p95 };
}

/** Compact dollars for an axis, never in scientific notation: $12, $0.35, $0.000004. */
function moneyAxis(v) {
  if (v === 0) return '$0';
  const a = Math.abs(v);
  if (a >= 100) return `$${v.toFixed(0)}`;
  if (a >= 0.01) return `$${v.toFixed(2)}`;
  return `$${v.toFixed(Math.min(10, 1 - Math.floor(Math.log10(a))))}`;
}

/** The accounts cooling down now, read every COOLING_MS (to explain 503 spikes). */
const COOLING_MS = 4000;
function useCooling() {
  const [cooling, setCooling] = useState([]);
  useEffect(() => {
    let stop = false;
    let timer;
    const load = async () => {
      try {
        const now = Date.now();
        const rows = await listAll('/accounts');
        if (!stop) setCooling(rows.filter((a) => a.cooldown_until && Date.parse(a.cooldown_until) > now));
      } catch {
        /* the refusals table then just has no cooling note */
      }
      if (!stop) timer = setTimeout(load, COOLING_MS);
    };
    load();
    return () => {
      stop = true;
      clearTimeout(timer);
    };
  }, []);
  return cooling;
}

function Stat({ label, value, sub, testid }) {
  return (
    <div class="stat card" data-testid={testid}>
      <div class="stat-label">{label}</div>
      <div class="stat-value">{value}</div>
      {sub && <div class="stat-sub">{sub}</div>}
    </div>
  );
}

function useMetrics() {
  const [tick, setTick] = useState(0);
  const [error, setError] = useState(null);
  useEffect(() => {
    let stop = false;
    let timer;
    const ctl = new AbortController();
    const poll = async () => {
      try {
        const text = await fetchMetrics(ctl.signal);
        pushSample(summarize(parsePrometheus(text)));
        setError(null);
      } catch (e) {
        if (e.name !== 'AbortError') setError(e);
      }
      if (!stop) {
        setTick((t) => t + 1);
        timer = setTimeout(poll, POLL_MS);
      }
    };
    poll();
    return () => {
      stop = true;
      ctl.abort();
      clearTimeout(timer);
    };
  }, []);
  return { tick, error };
}

function useSpend() {
  const [state, setState] = useState({ loading: true, data: null, error: null });
  useEffect(() => {
    let stop = false;
    let timer;
    const load = async () => {
      try {
        const from = new Date(Date.now() - 24 * 3600e3);
        from.setMinutes(0, 0, 0);
        const q = new URLSearchParams({ group_by: 'hour', from: from.toISOString() });
        const r = await api.get(`/usage/summary?${q}`);
        if (!stop) setState({ loading: false, data: r.data || [], error: null });
      } catch (error) {
        if (!stop) setState((s) => ({ ...s, loading: false, error }));
      }
      if (!stop) timer = setTimeout(load, SPEND_POLL_MS);
    };
    load();
    return () => {
      stop = true;
      clearTimeout(timer);
    };
  }, []);
  return state;
}

export function Dashboard() {
  const { tick, error } = useMetrics();
  const spend = useSpend();
  const cooling = useCooling();
  const s = series();
  const last = samples[samples.length - 1];
  const lastRate = samples.length > 1 ? ratePoint(samples[Math.max(0, samples.length - 1 - RATE_SPAN)], last) : null;
  const lastTtft = samples.length > 1 ? ratePoint(samples[Math.max(0, samples.length - 1 - TTFT_SPAN)], last) : null;

  // One bar per hour of the last 24, zero where nothing was billed.
  const spendData = useMemo(() => {
    const byHour = new Map((spend.data || []).map((r) => [Math.floor(Date.parse(r.key) / 3600e3), Number(r.cost) || 0]));
    const last = Math.floor(Date.now() / 3600e3);
    const hours = Array.from({ length: 25 }, (_, i) => last - 24 + i);
    return [hours.map((h) => h * 3600), hours.map((h) => byHour.get(h) || null)];
  }, [spend.data]);
  const refusals = refusalRows(samples.length > 1 ? samples[Math.max(0, samples.length - 1 - RATE_SPAN)] : null, last);
  const top = refusals[0]?.recent > 0 ? refusals[0] : null;
  const spend24 = (spend.data || []).reduce((a, r) => a + (Number(r.cost) || 0), 0);
  const req24 = (spend.data || []).reduce((a, r) => a + (Number(r.requests) || 0), 0);

  const statuses = last
    ? Object.entries(last.byStatus)
        .map(([k, v]) => [...k.split(' '), v])
        .sort((a, b) => a[0].localeCompare(b[0]) || String(a[1]).localeCompare(String(b[1])))
    : [];

  return (
    <div data-tick={tick}>
      <PageHead title="Dashboard" sub={`Live from GET /metrics every ${POLL_MS / 1000} s; spend from the usage summary.`} />
      <Guide />
      {error && <ErrorBox error={{ plain: `Cannot read the gateway's metrics: ${error.plain || error.message}` }} />}
      {!last && !error && <Spinner label="Reading the gateway's metrics…" />}
      {last && (
        <>
          <div class="stats">
            <Stat testid="stat-requests" label="Requests served" value={num(last.requests)} sub="client traffic since the gateway started" />
            <Stat testid="stat-rps" label="Requests / s" value={lastRate ? num(lastRate.rps, 2) : '…'} sub="last 10 s" />
            <Stat
              testid="stat-errors"
              label="Error rate"
              value={lastRate?.errorPct == null ? '—' : `${lastRate.errorPct.toFixed(1)}%`}
              sub={
                lastRate?.serverErrorPct == null
                  ? 'no requests in the last 10 s'
                  : `5xx ${lastRate.serverErrorPct.toFixed(1)}%, last 10 s${
                      top ? `; mostly ${REASONS[top.code]?.[1] ?? top.code}${REASONS[top.code]?.[0] ? ` (${REASONS[top.code][0]})` : ''}` : ''
                    }`
              }
            />
            <Stat
              testid="stat-ttft"
              label="TTFT p50 / p95"
              value={lastTtft?.p50ms == null ? '—' : `${ms(lastTtft.p50ms)} / ${ms(lastTtft.p95ms)}`}
              sub="last 30 s"
            />
            <Stat
              label="In flight"
              value={num(Math.max(0, last.inflight - 1))}
              sub={`${num(last.connections)} open connections (this page's poll not counted)`}
            />
            <Stat label="Tokens" value={`${num(last.tokensIn)} in`} sub={`${num(last.tokensOut)} out since start`} />
            <Stat
              testid="stat-sticky"
              label="Sticky hit ratio"
              value={last.stickyBound ? `${Math.round((100 * last.stickyHits) / last.stickyBound)}%` : '—'}
              sub={`${num(last.stickyHits)} of ${num(last.stickyBound)} bound conversations' requests kept their account (prompt cache); ${num(last.quotaSkips)} accounts passed over as spent`}
            />
            <Stat
              testid="stat-spend"
              label="Spend, last 24 h"
              value={spend.error ? '—' : money(spend24)}
              sub={spend.error ? 'usage summary unavailable' : `${num(req24)} billed requests`}
            />
          </div>
          {samples.length < 3 && <p class="hint">Rates appear after a few samples (a few seconds).</p>}
          <div class="charts">
            <Chart
              testid="chart-rps"
              title="Requests per second (10 s average)"
              series={[{ label: 'req/s' }]}
              data={[s.xs, s.rps]}
              xSpan={300}
              yFmt={(v) => v.toFixed(v < 10 ? 1 : 0)}
            />
            <Chart
              testid="chart-errors"
              title="Error rate (share of responses, 10 s)"
              series={[{ label: '4xx+5xx', color: '#d97706' }, { label: '5xx', color: '#dc2626' }]}
              data={[s.xs, s.err, s.err5]}
              xSpan={300}
              yMin={5}
              yFmt={(v) => `${v.toFixed(v > 0 && v < 10 ? 1 : 0)}%`}
            />
            <Chart
              testid="chart-ttft"
              title="Time to first token (30 s window)"
              series={[{ label: 'p50', color: '#059669' }, { label: 'p95', color: '#7c3aed' }]}
              data={[s.xs, s.p50, s.p95]}
              xSpan={300}
              yMin={10}
              yFmt={(v) => ms(v)}
            />
            {spend.error ? (
              <section class="chart card">
                <h3>Spend per hour</h3>
                <ErrorBox error={spend.error} />
              </section>
            ) : spend.loading ? (
              <section class="chart card">
                <h3>Spend per hour</h3>
                <Spinner />
              </section>
            ) : spend.data?.length ? (
              <Chart
                testid="chart-spend"
                title="Spend per hour (24 h)"
                series={[{ label: 'USD', color: '#2563eb' }]}
                data={spendData}
                bars
                xPad={1800}
                yMin={1e-6}
                yFmt={moneyAxis}
              />
            ) : (
              <section class="chart card">
                <h3>Spend per hour</h3>
                <Empty title="No billed requests in the last 24 hours.">
                  Spend appears here once requests are billed. Create a tenant and a key, then send a request with that key.
                </Empty>
              </section>
            )}
          </div>
          <section class="card">
            <h3>Refused by the gateway, by reason</h3>
            {refusals.length ? (
              <RefusalsTable rows={refusals} cooling={cooling} recentLabel="last 10 s" />
            ) : (
              <p class="muted">No request has been refused since the gateway started.</p>
            )}
          </section>
          <section class="card">
            <h3>Responses by route and status, since the gateway started</h3>
            {statuses.length ? (
              <table class="compact" data-testid="status-table">
                <thead>
                  <tr>
                    <th>route</th>
                    <th>status</th>
                    <th class="num">responses</th>
                  </tr>
                </thead>
                <tbody>
                  {statuses.map(([route, st, v]) => (
                    <tr key={`${route}${st}`} data-route={route} data-status={st}>
                      <td>{route}</td>
                      <td>{st}</td>
                      <td class="num">{num(v)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            ) : (
              <Empty title="No client traffic yet.">
                Create a key on the Keys page, then call <code>POST /v1/chat/completions</code> with it (any OpenAI SDK works with this
                gateway's address as its base URL).
              </Empty>
            )}
          </section>
        </>
      )}
    </div>
  );
}
