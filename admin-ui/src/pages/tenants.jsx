// Tenants: who pays. Balance, budget, spend; create, top up (a ledger row), suspend,
// delete.
import { useState } from 'preact/hooks';

import { api, listAll } from '../api.js';
import { Badge, Confirm, Empty, ErrorBox, Field, Form, Modal, PageHead, Spinner, Table, useLoad } from '../components.jsx';
import { money, optDecimal, when } from '../format.js';
import { navigate } from '../router.js';

function TopUp({ tenant, onClose, onDone }) {
  return (
    <Modal title={`Top up ${tenant.name}`} onClose={onClose}>
      <p>
        Current balance <strong>{money(tenant.balance)}</strong>. The amount is added to the balance and written to the ledger.
      </p>
      <Form
        submitLabel="Add to balance"
        busyLabel="Adding…"
        onCancel={onClose}
        onSubmit={async (v) => {
          const amount = v.amount.trim();
          if (!/^\d+(\.\d+)?$/.test(amount) || Number(amount) <= 0) {
            throw { field: 'amount', plain: 'Type a positive amount in dollars, like 25 or 25.50.' };
          }
          await api.post(`/tenants/${tenant.id}/topup`, { amount, note: v.note.trim() || undefined });
          onDone();
        }}
      >
        <Field label="Amount (USD)">
          <input name="amount" inputMode="decimal" placeholder="25.00" required />
        </Field>
        <Field label="Note" hint="Shown in the tenant's ledger, e.g. an invoice number.">
          <input name="note" placeholder="invoice 1042" />
        </Field>
      </Form>
    </Modal>
  );
}

/** A limit field's value: blank → null (no limit), else a whole number ≥ 0. */
function limitValue(v, name, label) {
  const t = String(v[name] ?? '').trim();
  if (!t) return null;
  const n = Number(t);
  if (!Number.isInteger(n) || n < 0) throw { field: name, plain: `${label} is a whole number of 0 or more, or blank for no limit.` };
  return n;
}

/** Name, budget and limits of a tenant (its balance changes only through top-ups). */
function EditTenant({ tenant, onClose, onDone }) {
  return (
    <Modal title={`Edit ${tenant.name}`} onClose={onClose}>
      <Form
        submitLabel="Save tenant"
        onCancel={onClose}
        onSubmit={async (v) => {
          if (!v.name.trim()) throw { field: 'name', plain: 'Give the tenant a name.' };
          const budget = optDecimal(v.budget);
          if (budget !== null && !(Number(budget) >= 0)) throw { field: 'budget', plain: 'The budget is an amount in dollars, or blank for none.' };
          await api.patch(`/tenants/${tenant.id}`, {
            name: v.name.trim(),
            budget,
            rpm: limitValue(v, 'rpm', 'Requests per minute'),
            rpm_burst: limitValue(v, 'rpm_burst', 'The burst'),
            tpm: limitValue(v, 'tpm', 'Tokens per minute'),
            concurrency: limitValue(v, 'concurrency', 'Concurrent requests'),
          });
          onDone();
        }}
      >
        <Field label="Name">
          <input name="name" defaultValue={tenant.name} />
        </Field>
        <Field label="Budget (USD)" hint="Spending cap over all its keys; blank for none.">
          <input name="budget" inputMode="decimal" defaultValue={tenant.budget ?? ''} placeholder="none" />
        </Field>
        <Field label="Requests / minute" hint="All its keys together; blank: no limit.">
          <input name="rpm" inputMode="numeric" defaultValue={tenant.rpm ?? ''} />
        </Field>
        <Field label="Burst (requests)" hint="blank: the rpm">
          <input name="rpm_burst" inputMode="numeric" defaultValue={tenant.rpm_burst ?? ''} />
        </Field>
        <Field label="Tokens / minute" hint="blank: no limit">
          <input name="tpm" inputMode="numeric" defaultValue={tenant.tpm ?? ''} />
        </Field>
        <Field label="Concurrent requests" hint="blank: no limit">
          <input name="concurrency" inputMode="numeric" defaultValue={tenant.concurrency ?? ''} />
        </Field>
      </Form>
    </Modal>
  );
}

export function Tenants() {
  const { data, error, loading, reload } = useLoad(() => listAll('/tenants'));
  const [creating, setCreating] = useState(false);
  const [topup, setTopup] = useState(null);
  const [editing, setEditing] = useState(null);
  const [confirm, setConfirm] = useState(null);
  const rows = data || [];

  const columns = [
    { key: 'id', label: 'id', num: true },
    { key: 'name', label: 'name', render: (t) => <strong>{t.name}</strong> },
    { key: 'status', label: 'status', render: (t) => <Badge kind={t.status === 'active' ? 'ok' : 'warn'}>{t.status}</Badge> },
    { key: 'balance', label: 'balance', num: true, render: (t) => <span class={Number(t.balance) <= 0 ? 'bad' : ''}>{money(t.balance)}</span> },
    { key: 'budget', label: 'budget', num: true, render: (t) => (t.budget == null ? 'none' : money(t.budget)) },
    { key: 'spend', label: 'spend', num: true, render: (t) => money(t.spend) },
    { key: 'created_at', label: 'created', render: (t) => when(t.created_at) },
    {
      key: 'actions',
      label: '',
      render: (t) => (
        <div class="row-actions">
          <button type="button" class="small primary" onClick={() => setTopup(t)}>
            Top up
          </button>
          <button type="button" class="small" onClick={() => setEditing(t)}>
            Edit
          </button>
          <button type="button" class="small" onClick={() => navigate(`keys?tenant_id=${t.id}`)}>
            Keys
          </button>
          <button type="button" class="small" onClick={() => navigate(`ledger?tenant_id=${t.id}`)}>
            Ledger
          </button>
          <button
            type="button"
            class="small"
            onClick={() =>
              setConfirm({
                title: t.status === 'active' ? `Suspend ${t.name}?` : `Activate ${t.name}?`,
                text: t.status === 'active' ? 'Every key of this tenant is refused until it is activated again.' : 'Its keys work again.',
                label: t.status === 'active' ? 'Suspend' : 'Activate',
                danger: t.status === 'active',
                run: () => api.patch(`/tenants/${t.id}`, { status: t.status === 'active' ? 'suspended' : 'active' }),
              })
            }
          >
            {t.status === 'active' ? 'Suspend' : 'Activate'}
          </button>
          <button
            type="button"
            class="small danger-text"
            onClick={() =>
              setConfirm({
                title: `Delete ${t.name}?`,
                text: 'The tenant, its users and its keys are deleted. A tenant with a ledger (top-ups, billed usage) cannot be deleted: suspend it instead.',
                label: 'Delete',
                danger: true,
                run: () => api.del(`/tenants/${t.id}`),
              })
            }
          >
            Delete
          </button>
        </div>
      ),
    },
  ];

  return (
    <div>
      <PageHead title="Tenants" sub="Who pays: each key belongs to a tenant, whose balance requests are billed against.">
        <button type="button" class="primary" onClick={() => setCreating(true)}>
          New tenant
        </button>
      </PageHead>
      <ErrorBox error={error} onRetry={reload} />
      {loading && !data ? (
        <Spinner label="Loading tenants…" />
      ) : (
        <Table
          columns={columns}
          rows={rows}
          empty={
            !error && (
              <Empty title="No tenants yet.">
                Create the first tenant with <em>New tenant</em>, then give it a key on the Keys page.
              </Empty>
            )
          }
        />
      )}
      {creating && (
        <Modal title="New tenant" onClose={() => setCreating(false)}>
          <Form
            submitLabel="Create tenant"
            busyLabel="Creating…"
            onCancel={() => setCreating(false)}
            onSubmit={async (v) => {
              if (!v.name.trim()) throw { field: 'name', plain: 'Give the tenant a name.' };
              await api.post('/tenants', { name: v.name.trim(), balance: optDecimal(v.balance) ?? '0', budget: optDecimal(v.budget) });
              setCreating(false);
              reload();
            }}
          >
            <Field label="Name">
              <input name="name" placeholder="acme" required />
            </Field>
            <Field label="Opening balance (USD)" hint="Later money goes through top-ups.">
              <input name="balance" inputMode="decimal" placeholder="0.00" />
            </Field>
            <Field label="Budget (USD)" hint="Optional spending cap; blank for none.">
              <input name="budget" inputMode="decimal" placeholder="none" />
            </Field>
          </Form>
        </Modal>
      )}
      {editing && (
        <EditTenant
          tenant={editing}
          onClose={() => setEditing(null)}
          onDone={() => {
            setEditing(null);
            reload();
          }}
        />
      )}
      {topup && (
        <TopUp
          tenant={topup}
          onClose={() => setTopup(null)}
          onDone={() => {
            setTopup(null);
            reload();
          }}
        />
      )}
      {confirm && (
        <Confirm
          title={confirm.title}
          confirmLabel={confirm.label}
          danger={confirm.danger}
          onClose={() => setConfirm(null)}
          onConfirm={async () => {
            await confirm.run();
            reload();
          }}
        >
          {confirm.text}
        </Confirm>
      )}
    </div>
  );
}
