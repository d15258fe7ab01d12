// The capacity report per upstream account or per group over the last 7 or 14 days, as
// the gateway computes it from its rollups (GET /admin/api/v1/usage/capacity): equivalent
// value at list price, success rate, P95 time to first token, 429 share, utilisation,
// reset-window use of subscription accounts, and the recommended concurrency (accounts)
// or oversubscription (groups) with the rule that produced it. The chart is the time in
// flight per day of the five accounts of most value (usage/report by day and account).
import { useState } from 'preact/hooks';

import { api } from '../api.js';
import { Chart } from '../chart.jsx';
import { Empty, ErrorBox, Notice, PageHead, Spinner, useLoad } from '../components.jsx';
import { money, ms, num, pct } from '../format.js';
import { presetRange, reportQuery } from '../usage.js';

const TOP = 5;
const iso = (t) => new Date(t).toISOString().replace('.000Z', 'Z');

export function Capacity() {
  const [days, setDays] = useState(14);
  const [by, setBy] = useState('account');
  const { data, error, loading, reload } = useLoad(async () => {
    const range = presetRange(days * 24);
    const [cap, perDay] = await Promise.all([
      api.get(`/usage/capacity?from=${range.from}&to=${range.to}&by=${by}`),
      api.get(`/usage/report?${reportQuery({ ...range, groupBy: `day,${by}`, limit: 1000 })}`),
    ]);
    return { cap, perDay: perDay.data };
  }, [days, by]);

  const rows = data?.cap.data || [];
  const idKey = by === 'group' ? 'group_id' : 'account_id';
  const totalValue = rows.reduce((s, r) => s + Number(r.list_value), 0);
  // The chart: mean requests in flight per day (time in flight ÷ 24 h) of the top entries.
  const top = [...rows].sort((a, b) => Number(b.list_value) - Number(a.list_value)).slice(0, TOP);
  const days0 = [...new Set((data?.perDay || []).map((r) => r.day))].sort();
  const xs = days0.map((d) => Date.parse(`${d}T00:00:00Z`) / 1000);
  const series = top.map((r) => r.name || (r[idKey] == null ? '(none)' : `${by} ${r[idKey]}`));
  const ys = top.map((r) =>
    days0.map((d) => {
      const x = (data?.perDay || []).find((p) => p.day === d && (by === 'group' ? p.group_id : p.account_id) === r[idKey]);
      return x ? Number(x.busy_ms) / 86400e3 : 0;
    }),
  );

  return (
    <div>
      <PageHead title="Capacity" sub="Per upstream account or group: what it served, how well, how busy it was, and what it can take.">
        <div class="segmented" role="group" aria-label="report per">
          {['account', 'group'].map((b) => (
            <button key={b} type="button" class={b === by ? 'active' : ''} aria-pressed={b === by} onClick={() => setBy(b)}>
              per {b}
            </button>
          ))}
        </div>
        <div class="segmented" role="group" aria-label="window">
          {[7, 14].map((d) => (
            <button key={d} type="button" class={d === days ? 'active' : ''} aria-pressed={d === days} onClick={() => setDays(d)}>
              {d} days
            </button>
          ))}
        </div>
        <button type="button" onClick={reload} disabled={loading}>
          Refresh
        </button>
      </PageHead>
      <ErrorBox error={error} onRetry={reload} />
      {loading && <Spinner label="Asking the gateway for the capacity report…" />}
      {data && !loading && (
        <>
          <p class="hint" data-testid="capacity-range">
            From {iso(data.cap.from)} to {iso(data.cap.to)}, {num(data.cap.hours)} hours, computed by the gateway from its hourly rollups.{' '}
            {data.cap.ttft_error}.
          </p>
          {!data.cap.basis_ok && <Notice kind="warn">Less than 7 days: the recommendation rests on a short basis.</Notice>}
          {rows.length ? (
            <>
              {xs.length > 0 && (
                <div class="charts">
                  <Chart
                    testid="capacity-chart"
                    title={`Requests in flight per day (mean), the ${top.length} ${by}s of most value`}
                    series={series.map((label) => ({ label }))}
                    data={[xs, ...ys]}
                    bars={xs.length < 3}
                    xPad={43200}
                    yMin={0.01}
                    yFmt={(v) => v.toFixed(v < 10 ? 2 : 0)}
                  />
                </div>
              )}
              <div class="table-wrap" tabIndex={0} role="region" aria-label="capacity report">
                <table class="compact" data-testid="capacity-table">
                  <thead>
                    <tr>
                      <th>{by}</th>
                      <th class="num">concurrency</th>
                      <th class="num">requests</th>
                      <th class="num">equivalent value</th>
                      <th class="num">share</th>
                      <th class="num">success rate</th>
                      <th class="num">P95 TTFT</th>
                      <th class="num">429 share</th>
                      <th class="num">utilisation</th>
                      <th class="num">in flight P95</th>
                      {by === 'account' ? (
                        <>
                          <th>reset windows</th>
                          <th class="num">recommended concurrency</th>
                        </>
                      ) : (
                        <>
                          <th class="num">sold</th>
                          <th class="num">oversubscription</th>
                          <th class="num">recommended oversubscription</th>
                        </>
                      )}
                    </tr>
                  </thead>
                  <tbody>
                    {rows.map((r) => (
                      <tr key={String(r[idKey])} data-id={String(r[idKey] ?? 'none')}>
                        <td data-col="name">
                          <strong>{r.name || (r[idKey] == null ? (by === 'account' ? '(static upstream)' : '(no group)') : `${by} ${r[idKey]}`)}</strong>
                          {r.kind === 'subscription' && <span class="muted"> subscription</span>}
                          {r.status === 'disabled' && <span class="muted"> (disabled)</span>}
                        </td>
                        <td class="num" data-col="concurrency">
                          {num(r.concurrency)}
                        </td>
                        <td class="num" data-col="requests">
                          {num(r.requests)}
                        </td>
                        <td class="num" data-col="value">
                          {money(r.list_value)}
                        </td>
                        <td class="num share">
                          {totalValue > 0 ? (
                            <>
                              <span class="bar" style={{ width: `${Math.round((60 * Number(r.list_value)) / totalValue)}px` }} />
                              {pct(Number(r.list_value) / totalValue, 0)}
                            </>
                          ) : (
                            '—'
                          )}
                        </td>
                        <td class={`num ${r.success_rate != null && r.success_rate < 0.95 ? 'bad' : ''}`} data-col="success_rate">
                          {pct(r.success_rate)}
                        </td>
                        <td class="num" data-col="ttft_p95">
                          {ms(r.ttft_p95_ms)}
                        </td>
                        <td class={`num ${r.share_429 > 0.05 ? 'bad' : ''}`} data-col="share_429">
                          {pct(r.share_429)}
                        </td>
                        <td class="num" data-col="utilisation">
                          {r.utilisation == null ? '—' : pct(r.utilisation, 2)}
                        </td>
                        <td class="num" data-col="in_flight">
                          {num(r.in_flight.p95, 3)}
                        </td>
                        {by === 'account' ? (
                          <>
                            <td data-col="reset_windows">
                              {r.reset_windows
                                ? `${num(r.reset_windows.used)} of ${num(r.reset_windows.windows)} × ${r.reset_windows.window_hours} h used, peak ${num(r.reset_windows.peak_tokens)} tokens`
                                : '—'}
                            </td>
                            <td class="num" data-col="recommended">
                              <strong>{num(r.recommended_concurrency)}</strong>
                            </td>
                          </>
                        ) : (
                          <>
                            <td class="num" data-col="sold">
                              {r.sold_concurrency == null ? 'unbounded' : num(r.sold_concurrency)}
                            </td>
                            <td class="num" data-col="oversubscription">
                              {r.oversubscription == null ? '—' : `${num(r.oversubscription, 2)}×`}
                            </td>
                            <td class="num" data-col="recommended">
                              <strong>{r.recommended_oversubscription == null ? '—' : `${num(r.recommended_oversubscription, 2)}×`}</strong>
                            </td>
                          </>
                        )}
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
              <p class="rule" data-testid="capacity-rule">
                <strong>Rule:</strong> {data.cap.rule}. Utilisation is time in flight ÷ (window × concurrency); equivalent value is
                the successful requests' tokens at list price.
              </p>
            </>
          ) : (
            <Empty title="No usage in this window.">
              Once requests are billed, this report shows what each {by} served. Add upstream accounts on the Accounts page.
            </Empty>
          )}
        </>
      )}
    </div>
  );
}
