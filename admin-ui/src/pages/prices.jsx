// List prices per model, in USD per million tokens: what billing charges (times the
// group's rate multiplier) and what the capacity report values tokens at.
import { useState } from 'preact/hooks';

import { api, listAll } from '../api.js';
import { Confirm, Empty, ErrorBox, Field, Form, Modal, PageHead, Spinner, Table, useLoad } from '../components.jsx';
import { money, when } from '../format.js';

const FIELDS = [
  ['input', 'Input'],
  ['output', 'Output'],
  ['cache_read', 'Cache read'],
  ['cache_write', 'Cache write'],
  ['reasoning', 'Reasoning'],
];

function PriceForm({ price, onDone, onCancel }) {
  return (
    <Form
      submitLabel={price ? 'Save price' : 'Add price'}
      onCancel={onCancel}
      onSubmit={async (v) => {
        const body = {};
        for (const [k, label] of FIELDS) {
          const t = v[k].trim();
          if (t === '') {
            if (k === 'reasoning') body[k] = null;
            continue;
          }
          if (!/^\d+(\.\d+)?$/.test(t)) throw { plain: `${label}: type a price in dollars per million tokens, like 0.15.` };
          body[k] = t;
        }
        if (price) await api.patch(`/prices/${encodeURIComponent(price.model)}`, body);
        else {
          if (!v.model.trim()) throw { plain: 'Name the model, exactly as clients send it.' };
          await api.post('/prices', { model: v.model.trim(), ...body });
        }
        onDone();
      }}
    >
      {!price && (
        <Field label="Model" hint="As clients send it in the request." wide>
          <input name="model" placeholder="gpt-4o-mini" />
        </Field>
      )}
      {FIELDS.map(([k, label]) => (
        <Field key={k} label={`${label} (USD / 1M tokens)`} hint={k === 'reasoning' ? 'blank: priced as output' : undefined}>
          <input name={k} inputMode="decimal" defaultValue={price?.[k] ?? (k === 'reasoning' ? '' : '0')} />
        </Field>
      ))}
    </Form>
  );
}

export function Prices() {
  const { data, error, loading, reload } = useLoad(() => listAll('/prices'));
  const [editing, setEditing] = useState(null);
  const [confirm, setConfirm] = useState(null);

  const columns = [
    { key: 'model', label: 'model', render: (p) => <strong>{p.model}</strong> },
    ...FIELDS.map(([k, label]) => ({
      key: k,
      label: `${label.toLowerCase()} / 1M`,
      num: true,
      render: (p) => (p[k] == null ? <span class="muted">as output</span> : money(p[k], 2)),
    })),
    { key: 'updated_at', label: 'updated', render: (p) => when(p.updated_at) },
    {
      key: 'actions',
      label: '',
      render: (p) => (
        <div class="row-actions">
          <button type="button" class="small" onClick={() => setEditing(p)}>
            Edit
          </button>
          <button
            type="button"
            class="small danger-text"
            onClick={() => setConfirm({ title: `Delete the price of ${p.model}?`, run: () => api.del(`/prices/${encodeURIComponent(p.model)}`) })}
          >
            Delete
          </button>
        </div>
      ),
    },
  ];

  return (
    <div>
      <PageHead title="Prices" sub="USD per million tokens, by model. Billing multiplies them by the group's rate multiplier.">
        <button type="button" class="primary" onClick={() => setEditing('new')}>
          Add price
        </button>
      </PageHead>
      <ErrorBox error={error} onRetry={reload} />
      {loading && !data ? (
        <Spinner label="Loading prices…" />
      ) : (
        <Table
          columns={columns}
          rows={data || []}
          rowKey={(p) => p.model}
          empty={
            !error && (
              <Empty title="No prices yet.">
                Billing and the capacity report value tokens with these prices: add one for every model you offer.
              </Empty>
            )
          }
        />
      )}
      {editing && (
        <Modal title={editing === 'new' ? 'Add a price' : `Price of ${editing.model}`} onClose={() => setEditing(null)} wide>
          <PriceForm
            price={editing === 'new' ? null : editing}
            onCancel={() => setEditing(null)}
            onDone={() => {
              setEditing(null);
              reload();
            }}
          />
        </Modal>
      )}
      {confirm && (
        <Confirm
          title={confirm.title}
          confirmLabel="Delete"
          danger
          onClose={() => setConfirm(null)}
          onConfirm={async () => {
            await confirm.run();
            reload();
          }}
        >
          Billing and the capacity report have no price for this model until one is added again.
        </Confirm>
      )}
    </div>
  );
}
