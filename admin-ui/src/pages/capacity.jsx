// The capacity report per account over 7 or 14 days: equivalent value of the tokens it
// served at list price, success rate, P95 time to first token, share of 429s, and
// utilisation. Computed here from usage rows (see capacity.js for what is approximate).
import { useMemo, useRef, useState } from 'preact/hooks';

import { api, listAll } from '../api.js';
import { Empty, ErrorBox, Notice, PageHead, Spinner, useLoad } from '../components.jsx';
import { capacityReport } from '../capacity.js';
import { money, ms, num, pct } from '../format.js';

export function Capacity() {
  const [days, setDays] = useState(7);
  const [progress, setProgress] = useState(0);
  const ctl = useRef(null);
  const { data, error, loading, reload } = useLoad(async () => {
    ctl.current?.abort();
    const c = new AbortController();
    ctl.current = c;
    setProgress(0);
    const now = Date.now();
    const from = new Date(now - 14 * 86400e3).toISOString();
    const [accounts, prices, rows] = await Promise.all([
      listAll('/accounts'),
      listAll('/prices'),
      listAll('/usage', { query: { from }, limit: 1000, maxRows: 200000, signal: c.signal, onProgress: setProgress }),
    ]);
    return { accounts, prices, rows, now };
  });

  const report = useMemo(() => (data ? capacityReport(data.rows, { ...data, days }) : []), [data, days]);
  const totalValue = report.reduce((s, r) => s + r.value, 0);
  const unpriced = [...new Set(report.flatMap((r) => r.unpricedModels))];

  return (
    <div>
      <PageHead title="Capacity" sub="Per upstream account: what it served, how well, and how busy it was.">
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
      {loading && <Spinner label={`Reading usage rows of the last 14 days… ${num(progress)} so far`} />}
      {data && !loading && (
        <>
          <Notice kind="info">
            Computed in the browser from {num(data.rows.length)} usage rows (the admin API has no per-account summary). Approximate:
            values use today's list prices; a request is counted on the account that answered it last, so 429s that were retried on
            another account are not visible; unknown token counts count as zero; utilisation is request time ÷ (window × concurrency
            limit), an average, not a peak.
          </Notice>
          {unpriced.length > 0 && (
            <Notice kind="warn">
              No list price for {unpriced.join(', ')}: their tokens are valued at zero. Add prices on the Prices page.
            </Notice>
          )}
          {report.length ? (
            <>
              <div class="table-wrap">
                <table class="compact" data-testid="capacity-table">
                  <thead>
                    <tr>
                      <th>account</th>
                      <th class="num">requests</th>
                      <th class="num">equivalent value</th>
                      <th class="num">share</th>
                      <th class="num">success rate</th>
                      <th class="num">P95 TTFT</th>
                      <th class="num">429 share</th>
                      <th class="num">tokens</th>
                      <th class="num">utilisation</th>
                    </tr>
                  </thead>
                  <tbody>
                    {report.map((r) => (
                      <tr key={String(r.accountId)}>
                        <td>
                          <strong>{r.name}</strong>
                          {r.status === 'disabled' && <span class="muted"> (disabled)</span>}
                        </td>
                        <td class="num">{num(r.requests)}</td>
                        <td class="num">{money(r.value)}</td>
                        <td class="num share">
                          {totalValue > 0 ? (
                            <>
                              <span class="bar" style={{ width: `${Math.round((60 * r.value) / totalValue)}px` }} />
                              {pct(r.value / totalValue, 0)}
                            </>
                          ) : (
                            '—'
                          )}
                        </td>
                        <td class={`num ${r.successRate != null && r.successRate < 0.95 ? 'bad' : ''}`}>{pct(r.successRate)}</td>
                        <td class="num">{ms(r.p95TtftMs)}</td>
                        <td class={`num ${r.share429 > 0.05 ? 'bad' : ''}`}>{pct(r.share429)}</td>
                        <td class="num">{num(r.tokens)}</td>
                        <td class="num">{r.utilisation == null ? '—' : pct(r.utilisation, 2)}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
            </>
          ) : (
            <Empty title="No accounts and no usage yet.">
              Add upstream accounts on the Accounts page; once requests are billed, this report shows what each served.
            </Empty>
          )}
        </>
      )}
    </div>
  );
}
