// The usage explorer: billed requests filtered by tenant, key, model and time, read page
// by page from GET /admin/api/v1/usage, with totals and a CSV export made in the browser.
import { useEffect, useRef, useState } from 'preact/hooks';

import { fetchMetrics, listAll } from '../api.js';
import { Badge, Empty, ErrorBox, Field, Notice, PageHead, Spinner, useLoad } from '../components.jsx';
import { toCsv } from '../csv.js';
import { money, ms, num, when } from '../format.js';
import { parsePrometheus, refusalRows, summarize } from '../metrics.js';
import { RefusalsTable } from '../refusals.jsx';
import { queryParams } from '../router.js';

const SHOW = 500;
const MAX_ROWS = 100000;

/** datetime-local value (local time, minutes) for a Date. */
function localInput(d) {
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

export function Usage() {
  const q0 = queryParams();
  const [filters, setFilters] = useState({
    tenant_id: q0.tenant_id || '',
    key_id: q0.key_id || '',
    model: q0.model || '',
    from: q0.from || localInput(new Date(Date.now() - 24 * 3600e3)),
    to: q0.to || '',
  });
  const refs = useLoad(async () => {
    const [tenants, keys, accounts] = await Promise.all([listAll('/tenants'), listAll('/keys'), listAll('/accounts').catch(() => [])]);
    return { tenants, keys, accounts };
  });
  const [state, setState] = useState({ rows: null, loading: false, progress: 0, error: null, truncated: false });
  const ctl = useRef(null);
  // Requests the gateway refused are never billed, so they have no usage rows: their
  // counts by reason come from /metrics (since the gateway started).
  const refused = useLoad(async () => refusalRows(null, summarize(parsePrometheus(await fetchMetrics()))));

  const run = async (f = filters) => {
    if (f.from && f.to && new Date(f.from) >= new Date(f.to)) {
      setState((s) => ({ ...s, rows: [], loading: false, error: { plain: '"From" is after "To", so no row can match: swap them or clear "To".' } }));
      return;
    }
    ctl.current?.abort();
    const c = new AbortController();
    ctl.current = c;
    const query = {};
    if (f.tenant_id) query.tenant_id = f.tenant_id;
    if (f.key_id) query.key_id = f.key_id;
    if (f.model.trim()) query.model = f.model.trim();
    if (f.from) query.from = new Date(f.from).toISOString();
    if (f.to) query.to = new Date(f.to).toISOString();
    const qs = new URLSearchParams(Object.entries(f).filter(([, v]) => v));
    history.replaceState(null, '', `/admin/usage${qs.toString() ? `?${qs}` : ''}`);
    setState({ rows: null, loading: true, progress: 0, error: null, truncated: false });
    try {
      const rows = await listAll('/usage', {
        query,
        limit: 1000,
        maxRows: MAX_ROWS,
        signal: c.signal,
        onProgress: (n) => setState((s) => ({ ...s, progress: n })),
      });
      if (ctl.current === c) setState({ rows, loading: false, progress: rows.length, error: null, truncated: rows.length >= MAX_ROWS });
    } catch (error) {
      if (ctl.current !== c) return;
      if (error.name === 'AbortError') setState((s) => ({ ...s, loading: false, rows: s.rows ?? [], error: { plain: 'Stopped.' } }));
      else setState((s) => ({ ...s, loading: false, error }));
    }
  };

  useEffect(() => {
    run();
    return () => ctl.current?.abort();
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, []);

  const set = (k) => (e) => setFilters((f) => ({ ...f, [k]: e.currentTarget.value, ...(k === 'tenant_id' ? { key_id: '' } : {}) }));
  // A choice in a list applies at once; typed fields apply on Show (or Enter).
  const pick = (k) => (e) => {
    const f = { ...filters, [k]: e.currentTarget.value, ...(k === 'tenant_id' ? { key_id: '' } : {}) };
    setFilters(f);
    run(f);
  };
  const tenants = refs.data?.tenants || [];
  const keys = (refs.data?.keys || []).filter((k) => !filters.tenant_id || String(k.tenant_id) === filters.tenant_id);
  const rows = state.rows || [];
  const totals = rows.reduce(
    (t, r) => ({
      requests: t.requests + 1,
      ok: t.ok + (r.status >= 200 && r.status < 300 ? 1 : 0),
      input: t.input + (Number(r.input_tokens) || 0),
      output: t.output + (Number(r.output_tokens) || 0),
      cost: t.cost + (Number(r.cost) || 0),
    }),
    { requests: 0, ok: 0, input: 0, output: 0, cost: 0 },
  );
  const shown = rows.slice(-SHOW).reverse();
  const tenantName = (id) => tenants.find((t) => t.id === id)?.name ?? `#${id}`;
  const keyLabel = (id) => {
    const k = (refs.data?.keys || []).find((x) => x.id === id);
    return k ? `${k.name || 'unnamed'} (${k.prefix}…)` : `#${id}`;
  };

  const exportCsv = () => {
    // Names next to the ids, as they are now (a renamed tenant shows its new name).
    const named = rows.map((r) => ({
      ...r,
      tenant: tenants.find((t) => t.id === r.tenant_id)?.name ?? '',
      key: (refs.data?.keys || []).find((k) => k.id === r.api_key_id)?.name ?? '',
      account: (refs.data?.accounts || []).find((a) => a.id === r.account_id)?.name ?? '',
    }));
    const blob = new Blob([toCsv(named)], { type: 'text/csv;charset=utf-8' });
    const a = document.createElement('a');
    a.href = URL.createObjectURL(blob);
    const stamp = new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19);
    a.download = `tollgate-usage-${stamp}.csv`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  };

  return (
    <div>
      <PageHead title="Usage" sub="Billed requests, one row each, oldest first from the API; newest first here.">
        <button type="button" disabled={!rows.length || state.loading} onClick={exportCsv}>
          Export CSV ({num(rows.length)} rows)
        </button>
      </PageHead>
      <form
        class="filters"
        onSubmit={(e) => {
          e.preventDefault();
          run();
        }}
      >
        <Field label="Tenant">
          <select name="tenant_id" value={filters.tenant_id} onChange={pick('tenant_id')}>
            <option value="">all</option>
            {tenants.map((t) => (
              <option key={t.id} value={String(t.id)}>
                {t.name}
              </option>
            ))}
          </select>
        </Field>
        <Field label="Key">
          <select name="key_id" value={filters.key_id} onChange={pick('key_id')}>
            <option value="">all</option>
            {keys.map((k) => (
              <option key={k.id} value={String(k.id)}>
                {k.name || 'unnamed'} ({k.prefix}…)
              </option>
            ))}
          </select>
        </Field>
        <Field label="Model">
          <input name="model" value={filters.model} onInput={set('model')} placeholder="any" />
        </Field>
        <Field label="From">
          <input name="from" type="datetime-local" value={filters.from} onInput={set('from')} />
        </Field>
        <Field label="To">
          <input name="to" type="datetime-local" value={filters.to} onInput={set('to')} />
        </Field>
        <div class="filter-actions">
          <button type="submit" class="primary" disabled={state.loading}>
            {state.loading ? 'Loading…' : 'Show'}
          </button>
          {state.loading && (
            <button type="button" onClick={() => ctl.current?.abort()}>
              Stop
            </button>
          )}
        </div>
      </form>
      <ErrorBox error={refs.error} onRetry={refs.reload} />
      <ErrorBox error={state.error} onRetry={() => run()} />
      {state.loading && <Spinner label={`Loading usage rows… ${num(state.progress)} so far`} />}
      {state.truncated && <Notice kind="warn">Stopped at {num(MAX_ROWS)} rows: narrow the time range to see everything.</Notice>}
      {state.rows && !state.loading && (
        <>
          <div class="stats" data-testid="usage-totals">
            <div class="stat card">
              <div class="stat-label">Requests</div>
              <div class="stat-value" data-testid="usage-count">{num(totals.requests)}</div>
              <div class="stat-sub">{totals.requests ? `${Math.round((100 * totals.ok) / totals.requests)}% answered 2xx` : '—'}</div>
            </div>
            <div class="stat card">
              <div class="stat-label">Tokens</div>
              <div class="stat-value">{num(totals.input + totals.output)}</div>
              <div class="stat-sub">
                {num(totals.input)} in, {num(totals.output)} out
              </div>
            </div>
            <div class="stat card">
              <div class="stat-label">Cost</div>
              <div class="stat-value">{money(totals.cost)}</div>
              <div class="stat-sub">as billed</div>
            </div>
          </div>
          {rows.length ? (
            <div class="table-wrap">
              {rows.length > SHOW && <p class="hint">Showing the newest {SHOW} of {num(rows.length)}; the CSV has them all.</p>}
              <table class="compact" data-testid="usage-table">
                <thead>
                  <tr>
                    <th>time</th>
                    <th>tenant</th>
                    <th>key</th>
                    <th>model</th>
                    <th>status</th>
                    <th class="num">in</th>
                    <th class="num">out</th>
                    <th class="num">cost</th>
                    <th class="num">TTFT</th>
                    <th class="num">total</th>
                    <th>request id</th>
                  </tr>
                </thead>
                <tbody>
                  {shown.map((r) => (
                    <tr key={r.id}>
                      <td>{when(r.created_at)}</td>
                      <td>{tenantName(r.tenant_id)}</td>
                      <td>{keyLabel(r.api_key_id)}</td>
                      <td>{r.model}</td>
                      <td>
                        <Badge kind={r.status >= 200 && r.status < 300 ? 'ok' : 'bad'}>{r.status ?? '—'}</Badge>
                        {r.estimated && <span class="muted"> est.</span>}
                      </td>
                      <td class="num">{num(r.input_tokens)}</td>
                      <td class="num">{num(r.output_tokens)}</td>
                      <td class="num">{money(r.cost, 4)}</td>
                      <td class="num">{ms(r.ttft_ms)}</td>
                      <td class="num">{ms(r.total_ms)}</td>
                      <td>
                        <code class="clip">{r.request_id}</code>
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          ) : (
            <Empty title="No usage rows match.">
              Widen the filters or the time range. Rows are written when requests are billed: if requests went through just now and
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
