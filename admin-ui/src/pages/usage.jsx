// Usage: the admin API's reports from the rollups (GET /admin/api/v1/usage/report) for a
// range, a grouping and filters — totals, a chart over time and the grouped rows a page
// at a time — and the CSV export streamed by the server (usage/export). Nothing is summed
// here: every number on the page is one the API returned.
import { useEffect, useRef, useState } from 'preact/hooks';

import { api, fetchMetrics, listAll } from '../api.js';
import { Chart } from '../chart.jsx';
import { Empty, ErrorBox, Field, PageHead, Spinner, useLoad } from '../components.jsx';
import { money, ms, num, pct } from '../format.js';
import { parsePrometheus, refusalRows, summarize } from '../metrics.js';
import { RefusalsTable } from '../refusals.jsx';
import { queryParams } from '../router.js';
import { dayBound, nextDay, presetRange, reportQuery, seriesOf } from '../usage.js';

const PAGE = 100;
const PRESETS = [
  ['24h', '24 hours', 24],
  ['7d', '7 days', 7 * 24],
  ['14d', '14 days', 14 * 24],
  ['30d', '30 days', 30 * 24],
];
const TIMES = [
  ['', 'none'],
  ['hour', 'hour'],
  ['day', 'day'],
];
const DIMS = [
  ['', 'none'],
  ['model', 'model'],
  ['account', 'account'],
  ['group', 'group'],
  ['tenant', 'tenant'],
  ['key', 'key'],
];

/** The range a form state asks for ({from, to} in the API's form, or {error}). */
function rangeOf(f) {
  const p = PRESETS.find(([id]) => id === f.range);
  if (p) return presetRange(p[2]);
  if (!f.from_day || !f.to_day) return { error: 'Pick both days of a custom range.' };
  if (f.from_day > f.to_day) return { error: '"From" is after "To": swap them.' };
  return { from: dayBound(f.from_day), to: dayBound(nextDay(f.to_day)) };
}

function groupOf(f) {
  return [f.time, f.dim].filter(Boolean).join(',');
}

function filtersOf(f) {
  return { tenant_id: f.tenant_id, key_id: f.key_id, account_id: f.account_id, group_id: f.group_id, model: f.model.trim() };
}

export function Usage() {
  const q0 = queryParams();
  const [form, setForm] = useState({
    range: q0.range || (q0.from_day ? 'custom' : '24h'),
    from_day: q0.from_day || '',
    to_day: q0.to_day || '',
    time: q0.time ?? 'hour',
    dim: q0.dim ?? '',
    tenant_id: q0.tenant_id || '',
    key_id: q0.key_id || '',
    account_id: q0.account_id || '',
    group_id: q0.group_id || '',
    model: q0.model || '',
  });
  const refs = useLoad(async () => {
    const [tenants, keys, accounts, groups] = await Promise.all([
      listAll('/tenants'),
      listAll('/keys'),
      listAll('/accounts').catch(() => []),
      listAll('/groups').catch(() => []),
    ]);
    return { tenants, keys, accounts, groups };
  });
  // {query: what was asked, totals, chart, page: {data, has_more, next_page_token}, tokens: the page tokens so far}
  const [st, setSt] = useState({ loading: false, error: null, query: null, totals: null, chart: null, page: null, tokens: [] });
  const seq = useRef(0);
  // Refused requests are never billed, so they are in no report: their counts by reason
  // come from /metrics (since the gateway started).
  const refused = useLoad(async () => refusalRows(null, summarize(parsePrometheus(await fetchMetrics()))));

  const load = async (f, tokens = []) => {
    const range = rangeOf(f);
    const my = ++seq.current;
    if (range.error) {
      setSt((s) => ({ ...s, loading: false, error: { plain: range.error } }));
      return;
    }
    const filters = filtersOf(f);
    const groupBy = groupOf(f);
    const query = { ...range, groupBy, filters };
    const qs = new URLSearchParams(Object.entries(f).filter(([, v]) => v !== ''));
    history.replaceState(null, '', `/admin/usage?${qs}`);
    setSt((s) => ({ ...s, loading: true, error: null }));
    try {
      const hours = (Date.parse(range.to) - Date.parse(range.from)) / 3600e3;
      const chartBy = hours <= 72 ? 'hour' : 'day';
      const pageToken = tokens[tokens.length - 1];
      const [totals, chart, page] = await Promise.all([
        api.get(`/usage/report?${reportQuery({ ...range, groupBy: '', filters })}`),
        api.get(`/usage/report?${reportQuery({ ...range, groupBy: chartBy, filters, limit: 1000 })}`),
        api.get(`/usage/report?${reportQuery({ ...range, groupBy, filters, limit: PAGE, pageToken })}`),
      ]);
      if (my !== seq.current) return;
      setSt({ loading: false, error: null, query, totals: totals.data[0] || null, chart: { by: chartBy, ...seriesOf(chart.data) }, page, tokens });
    } catch (error) {
      if (my === seq.current) setSt((s) => ({ ...s, loading: false, error }));
    }
  };

  useEffect(() => {
    load(form);
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, []);

  const set = (k) => (e) => setForm((f) => ({ ...f, [k]: e.currentTarget.value, ...(k === 'tenant_id' ? { key_id: '' } : {}) }));
  // A choice in a list applies at once; typed fields apply on Show (or Enter).
  const pick = (k) => (e) => {
    const f = { ...form, [k]: e.currentTarget.value, ...(k === 'tenant_id' ? { key_id: '' } : {}) };
    setForm(f);
    if (k !== 'range' || f.range !== 'custom') load(f);
  };
  const tenants = refs.data?.tenants || [];
  const keysAll = refs.data?.keys || [];
  const keys = keysAll.filter((k) => !form.tenant_id || String(k.tenant_id) === form.tenant_id);
  const accounts = refs.data?.accounts || [];
  const groups = refs.data?.groups || [];
  const nameOf = (list, id, label) => {
    if (id == null) return label === 'account' ? '(static upstream)' : '(none)';
    const x = list.find((t) => t.id === id);
    return x ? x.name || `${label} ${id}` : `${label} ${id}`;
  };
  const q = st.query;
  const cols = q ? q.groupBy.split(',').filter(Boolean) : [];
  const t = st.totals;
  const exportHref = q
    ? `/admin/api/v1/usage/export?${reportQuery({ from: q.from, to: q.to, groupBy: q.groupBy || 'hour,tenant,key,group,account,model', filters: q.filters })}`
    : null;
  const keyCell = (r, c) => {
    if (c === 'hour') return r.hour.replace('T', ' ').replace(':00:00Z', ':00 UTC');
    if (c === 'day') return r.day;
    if (c === 'model') return r.model;
    if (c === 'tenant') return nameOf(tenants, r.tenant_id, 'tenant');
    if (c === 'key') return nameOf(keysAll, r.api_key_id, 'key');
    if (c === 'group') return nameOf(groups, r.group_id, 'group');
    return nameOf(accounts, r.account_id, 'account');
  };

  return (
    <div>
      <PageHead title="Usage" sub="Billed requests summed by the gateway from its hourly rollups, for any range and grouping.">
        {exportHref && (
          <a class="button" href={exportHref} download="usage.csv" data-testid="usage-export">
            Export CSV
          </a>
        )}
      </PageHead>
      <form
        class="filters"
        onSubmit={(e) => {
          e.preventDefault();
          load(form);
        }}
      >
        <Field label="Range">
          <select name="range" value={form.range} onChange={pick('range')}>
            {PRESETS.map(([id, label]) => (
              <option key={id} value={id}>
                last {label}
              </option>
            ))}
            <option value="custom">days (UTC)…</option>
          </select>
        </Field>
        {form.range === 'custom' && (
          <>
            <Field label="From day (UTC)">
              <input name="from_day" type="date" value={form.from_day} onInput={set('from_day')} />
            </Field>
            <Field label="To day (UTC, included)">
              <input name="to_day" type="date" value={form.to_day} onInput={set('to_day')} />
            </Field>
          </>
        )}
        <Field label="Per">
          <select name="time" value={form.time} onChange={pick('time')}>
            {TIMES.map(([v, l]) => (
              <option key={v} value={v}>
                {l}
              </option>
            ))}
          </select>
        </Field>
        <Field label="Group by">
          <select name="dim" value={form.dim} onChange={pick('dim')}>
            {DIMS.map(([v, l]) => (
              <option key={v} value={v}>
                {l}
              </option>
            ))}
          </select>
        </Field>
        <Field label="Tenant">
          <select name="tenant_id" value={form.tenant_id} onChange={pick('tenant_id')}>
            <option value="">all</option>
            {tenants.map((x) => (
              <option key={x.id} value={String(x.id)}>
                {x.name}
              </option>
            ))}
          </select>
        </Field>
        <Field label="Key">
          <select name="key_id" value={form.key_id} onChange={pick('key_id')}>
            <option value="">all</option>
            {keys.map((k) => (
              <option key={k.id} value={String(k.id)}>
                {k.name || 'unnamed'} ({k.prefix}…)
              </option>
            ))}
          </select>
        </Field>
        <Field label="Account">
          <select name="account_id" value={form.account_id} onChange={pick('account_id')}>
            <option value="">all</option>
            {accounts.map((a) => (
              <option key={a.id} value={String(a.id)}>
                {a.name}
              </option>
            ))}
          </select>
        </Field>
        <Field label="Model">
          <input name="model" value={form.model} onInput={set('model')} placeholder="any" />
        </Field>
        <div class="filter-actions">
          <button type="submit" class="primary" disabled={st.loading}>
            {st.loading ? 'Loading…' : 'Show'}
          </button>
        </div>
      </form>
      <ErrorBox error={refs.error} onRetry={refs.reload} />
      <ErrorBox error={st.error} onRetry={() => load(form, st.tokens)} />
      {st.loading && !st.page && <Spinner label="Asking the gateway for the report…" />}
      {q && st.page && (
        <>
          <p class="hint" data-testid="usage-range">
            From {q.from.replace('T', ' ').replace('Z', ' UTC')} to {q.to.replace('T', ' ').replace('Z', ' UTC')} (the end excluded).
          </p>
          <div class="stats" data-testid="usage-totals">
            <div class="stat card">
              <div class="stat-label">Requests</div>
              <div class="stat-value" data-testid="usage-count">{num(t?.requests ?? 0)}</div>
              <div class="stat-sub" data-testid="usage-success">{t ? `${pct(t.success_rate)} succeeded` : '—'}</div>
            </div>
            <div class="stat card">
              <div class="stat-label">Errors</div>
              <div class="stat-value" data-testid="usage-429">{num(t?.errors['429'] ?? 0)} × 429</div>
              <div class="stat-sub">
                {t ? `${num(t.errors['5xx'])} 5xx, ${num(t.errors.timeout)} timeouts, ${num(t.errors.client_gone)} client gone` : '—'}
              </div>
            </div>
            <div class="stat card">
              <div class="stat-label">Tokens</div>
              <div class="stat-value" data-testid="usage-tokens">{num(t ? Number(t.tokens.input) + Number(t.tokens.output) : 0)}</div>
              <div class="stat-sub">{t ? `${num(t.tokens.input)} in, ${num(t.tokens.output)} out` : '—'}</div>
            </div>
            <div class="stat card">
              <div class="stat-label">Cost</div>
              <div class="stat-value" data-testid="usage-cost">{money(t?.cost ?? 0)}</div>
              <div class="stat-sub">{t ? `${money(t.list_value)} at list price` : 'as billed'}</div>
            </div>
            <div class="stat card">
              <div class="stat-label">TTFT P95</div>
              <div class="stat-value" data-testid="usage-ttft">{ms(t?.ttft.p95_ms)}</div>
              <div class="stat-sub">{t ? `P50 ${ms(t.ttft.p50_ms)} (±9.1%)` : '—'}</div>
            </div>
          </div>
          {st.chart && st.chart.xs.length > 0 && (
            <div class="charts">
              <Chart
                testid="usage-chart-requests"
                title={`Requests per ${st.chart.by}`}
                series={[{ label: 'succeeded', color: '#059669' }, { label: 'failed', color: '#dc2626' }]}
                data={[st.chart.xs, st.chart.ok, st.chart.bad]}
                bars
                xPad={st.chart.by === 'hour' ? 1800 : 43200}
                yFmt={(v) => num(v)}
              />
              <Chart
                testid="usage-chart-cost"
                title={`Cost per ${st.chart.by}`}
                series={[{ label: 'cost', color: '#2563eb' }]}
                data={[st.chart.xs, st.chart.cost]}
                bars
                xPad={st.chart.by === 'hour' ? 1800 : 43200}
                yMin={0.01}
                yFmt={(v) => money(v.toFixed(4))}
              />
            </div>
          )}
          {st.page.data.length ? (
            <div class="table-wrap" tabIndex={0} role="region" aria-label="usage report">
              <table class="compact" data-testid="usage-table">
                <thead>
                  <tr>
                    {cols.map((c) => (
                      <th key={c}>{c}</th>
                    ))}
                    <th class="num">requests</th>
                    <th class="num">success rate</th>
                    <th class="num">429</th>
                    <th class="num">5xx</th>
                    <th class="num">timeout</th>
                    <th class="num">client gone</th>
                    <th class="num">in</th>
                    <th class="num">out</th>
                    <th class="num">cost</th>
                    <th class="num">list value</th>
                    <th class="num">TTFT P50</th>
                    <th class="num">TTFT P95</th>
                  </tr>
                </thead>
                <tbody>
                  {st.page.data.map((r, i) => (
                    <tr key={i}>
                      {cols.map((c) => (
                        <td key={c} data-col={c}>
                          {keyCell(r, c)}
                        </td>
                      ))}
                      <td class="num" data-col="requests">
                        {num(r.requests)}
                      </td>
                      <td class="num" data-col="success_rate">
                        {pct(r.success_rate)}
                      </td>
                      <td class="num" data-col="429">
                        {num(r.errors['429'])}
                      </td>
                      <td class="num">{num(r.errors['5xx'])}</td>
                      <td class="num">{num(r.errors.timeout)}</td>
                      <td class="num">{num(r.errors.client_gone)}</td>
                      <td class="num" data-col="input">
                        {num(r.tokens.input)}
                      </td>
                      <td class="num" data-col="output">
                        {num(r.tokens.output)}
                      </td>
                      <td class="num" data-col="cost">
                        {money(r.cost, 4)}
                      </td>
                      <td class="num">{money(r.list_value, 4)}</td>
                      <td class="num">{ms(r.ttft.p50_ms)}</td>
                      <td class="num">{ms(r.ttft.p95_ms)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
              <div class="pager" data-testid="usage-pager">
                <button type="button" disabled={!st.tokens.length || st.loading} onClick={() => load(form, st.tokens.slice(0, -1))}>
                  Previous page
                </button>
                <span>
                  Page {st.tokens.length + 1}
                  {st.page.has_more ? '' : ' (last)'}
                </span>
                <button
                  type="button"
                  disabled={!st.page.has_more || st.loading}
                  onClick={() => load(form, [...st.tokens, st.page.next_page_token])}
                >
                  Next page
                </button>
              </div>
            </div>
          ) : (
            <Empty title="No usage in this range.">
              Widen the filters or the range. Requests are counted when they are billed: if requests went through just now and
              nothing shows, billing may not be enabled on this gateway (it needs Postgres and Redis).
            </Empty>
          )}
        </>
      )}
      <section class="card" data-testid="usage-refusals">
        <h3>Refused by the gateway (not billed, so not above), since it started</h3>
        {refused.data?.length ? (
          <RefusalsTable rows={refused.data} recentLabel="" />
        ) : (
          <p class="muted">{refused.error ? "The gateway's metrics could not be read." : 'No request has been refused since the gateway started.'}</p>
        )}
      </section>
    </div>
  );
}
