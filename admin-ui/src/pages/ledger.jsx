// The ledger: every change of a tenant's balance (opening, top-ups, usage debits,
// adjustments), newest first, a page at a time (GET ledger?before=).
import { useState } from 'preact/hooks';

import { api, listAll } from '../api.js';
import { Badge, Empty, ErrorBox, Field, PageHead, Spinner, Table, useLoad } from '../components.jsx';
import { money, when } from '../format.js';
import { queryParams } from '../router.js';

const PAGE = 100;

export function Ledger() {
  const [tenantId, setTenantId] = useState(queryParams().tenant_id || '');
  const [kind, setKind] = useState(queryParams().kind || '');
  const [more, setMore] = useState({ rows: [], next: null, busy: false, error: null });
  const tenants = useLoad(() => listAll('/tenants'));
  const page = useLoad(async () => {
    const q = new URLSearchParams({ limit: String(PAGE) });
    if (tenantId) q.set('tenant_id', tenantId);
    if (kind) q.set('kind', kind);
    const p = await api.get(`/ledger?${q}`);
    setMore({ rows: [], next: p.has_more ? p.next_before : null, busy: false, error: null });
    return p;
  }, [tenantId, kind]);
  const pick = (t, k) => {
    setTenantId(t);
    setKind(k);
    const q = new URLSearchParams();
    if (t) q.set('tenant_id', t);
    if (k) q.set('kind', k);
    history.replaceState(null, '', `/admin/ledger${q.size ? `?${q}` : ''}`);
  };
  const loadMore = async () => {
    setMore((m) => ({ ...m, busy: true, error: null }));
    try {
      const q = new URLSearchParams({ limit: String(PAGE), before: String(more.next) });
      if (tenantId) q.set('tenant_id', tenantId);
      if (kind) q.set('kind', kind);
      const p = await api.get(`/ledger?${q}`);
      setMore((m) => ({ rows: [...m.rows, ...p.data], next: p.has_more ? p.next_before : null, busy: false, error: null }));
    } catch (error) {
      setMore((m) => ({ ...m, busy: false, error }));
    }
  };
  const rows = [...(page.data?.data || []), ...more.rows];
  const columns = [
    { key: 'created_at', label: 'when', render: (r) => when(r.created_at) },
    { key: 'tenant', label: 'tenant', render: (r) => r.tenant },
    { key: 'kind', label: 'kind', render: (r) => <Badge kind={r.kind === 'usage' ? 'neutral' : 'ok'}>{r.kind}</Badge> },
    { key: 'amount', label: 'amount', num: true, render: (r) => money(r.amount) },
    { key: 'note', label: 'note', render: (r) => r.note || (r.request_id ? <code>{r.request_id}</code> : <span class="muted">—</span>) },
  ];
  return (
    <div>
      <PageHead title="Ledger" sub="Every change of a tenant's balance: the opening balance, top-ups, usage debits and adjustments." />
      <div class="filters">
        <Field label="Tenant">
          <select name="tenant_id" value={tenantId} onChange={(e) => pick(e.currentTarget.value, kind)}>
            <option value="">all tenants</option>
            {(tenants.data || []).map((t) => (
              <option key={t.id} value={String(t.id)}>
                {t.name}
              </option>
            ))}
          </select>
        </Field>
        <Field label="Kind">
          <select name="kind" value={kind} onChange={(e) => pick(tenantId, e.currentTarget.value)}>
            <option value="">every kind</option>
            {['opening', 'topup', 'usage', 'adjustment'].map((k) => (
              <option key={k} value={k}>
                {k}
              </option>
            ))}
          </select>
        </Field>
      </div>
      <ErrorBox error={page.error || tenants.error} onRetry={page.reload} />
      {page.loading && !page.data ? (
        <Spinner label="Loading the ledger…" />
      ) : (
        <Table
          class="ledger"
          columns={columns}
          rows={rows}
          empty={!page.error && <Empty title="No ledger entries match.">Top-ups and billed usage appear here.</Empty>}
        />
      )}
      <ErrorBox error={more.error} onRetry={loadMore} />
      {more.next != null && (
        <button type="button" onClick={loadMore} disabled={more.busy}>
          {more.busy ? 'Loading…' : `Show ${PAGE} older`}
        </button>
      )}
    </div>
  );
}
