// The first screen's guide (on the dashboard): what to do next on an empty or a demo
// state. Six steps take a new deployment to its first billed request — a group, an
// upstream account in it, prices, a tenant with a balance, a key in the group, a request
// — each ticked from what the admin API lists, each undone one a link to the page that
// does it. Once every step is done (the quickstart's demo state) it says where to look
// and what to try next; the operator can hide it (remembered in this browser).
import { useEffect, useState } from 'preact/hooks';

import { api } from './api.js';
import { navigate } from './router.js';

const HIDDEN_KEY = 'tg-guide-hidden';

/** What the admin API lists, one small read per table. */
async function readState() {
  const first = async (p) => (await api.get(p)).data || [];
  const [groups, accounts, prices, tenants, keys, usage] = await Promise.all([
    first('/groups?limit=100'),
    first('/accounts?limit=100'),
    first('/prices?limit=100'),
    first('/tenants?limit=100'),
    first('/keys?limit=100'),
    first('/usage?limit=1'),
  ]);
  return { groups, accounts, prices, tenants, keys, usage };
}

/** The steps, each {id, done, title, how, page, action}, from what readState() read. */
export function guideSteps(s) {
  const inGroup = (a) => (a.groups || []).length > 0;
  const active = (x) => x.status === 'active';
  return [
    {
      id: 'group',
      done: s.groups.length > 0,
      title: 'Create a group',
      how: 'A group is a pool of upstream accounts that keys route over, with the models it offers.',
      page: 'groups',
      action: 'Create a group',
    },
    {
      id: 'account',
      done: s.accounts.some((a) => active(a) && inGroup(a)),
      title: 'Add an upstream account to the group',
      how: "A provider's base URL and API key (stored sealed). Several accounts in a group share its traffic and stand in for each other.",
      page: 'accounts',
      action: 'Add an account',
    },
    {
      id: 'price',
      done: s.prices.length > 0,
      title: 'Set prices for your models',
      how: 'USD per million tokens: what a request costs its tenant.',
      page: 'prices',
      action: 'Set a price',
    },
    {
      id: 'tenant',
      done: s.tenants.some((t) => active(t) && Number(t.balance) > 0),
      title: 'Create a tenant with a balance',
      how: 'A team or customer: requests are paid from its balance, and its limits hold across all its keys.',
      page: 'tenants',
      action: 'Create a tenant',
    },
    {
      id: 'key',
      done: s.keys.some((k) => active(k) && k.group_id),
      title: 'Create a key for the tenant, in the group',
      how: 'The key is shown once. Give it rate, concurrency and budget limits if you like.',
      page: 'keys',
      action: 'Create a key',
    },
    {
      id: 'request',
      done: s.usage.length > 0,
      title: 'Send a request with the key',
      how: null, // the curl line below
      page: 'usage',
      action: 'See usage',
    },
  ];
}

function Link({ page, children, testid }) {
  return (
    <a
      href={`/admin/${page}`}
      data-testid={testid}
      onClick={(e) => {
        e.preventDefault();
        navigate(page);
      }}
    >
      {children}
    </a>
  );
}

export function Guide() {
  const [state, setState] = useState(null);
  const [hidden, setHidden] = useState(() => {
    try {
      return localStorage.getItem(HIDDEN_KEY) === '1';
    } catch {
      return false;
    }
  });
  useEffect(() => {
    let stop = false;
    readState()
      .then((s) => !stop && setState(s))
      .catch(() => {}); // the dashboard's own reads say what is wrong
    return () => {
      stop = true;
    };
  }, []);
  if (!state || hidden) return null;
  const hide = () => {
    try {
      localStorage.setItem(HIDDEN_KEY, '1');
    } catch {
      /* private mode: hidden until the next visit */
    }
    setHidden(true);
  };
  const steps = guideSteps(state);
  const next = steps.find((x) => !x.done);
  const origin = location.origin;
  const curl = `curl ${origin}/v1/chat/completions -H "Authorization: Bearer $KEY" \\\n  -d '{"model":"${state.prices[0]?.model || 'MODEL'}","messages":[{"role":"user","content":"hello"}]}'`;

  if (!next) {
    const t = state.tenants[0];
    return (
      <section class="card guide" data-testid="guide" data-state="ready" aria-labelledby="guide-title">
        <div class="guide-head">
          <h2 id="guide-title">Set up and serving</h2>
          <button type="button" class="small" onClick={hide}>
            Hide this guide
          </button>
        </div>
        <p>
          {state.tenants.length} tenant{state.tenants.length === 1 ? '' : 's'}
          {t ? ` (${t.name}, balance $${t.balance})` : ''}, {state.keys.length} key{state.keys.length === 1 ? '' : 's'},{' '}
          {state.accounts.filter((a) => a.status === 'active').length} active account
          {state.accounts.filter((a) => a.status === 'active').length === 1 ? '' : 's'} in {state.groups.length} group
          {state.groups.length === 1 ? '' : 's'}, and requests billed. What to do next:
        </p>
        <ul class="guide-next">
          <li>
            <Link page="usage" testid="guide-usage">See each request and what it cost</Link> — and in the{' '}
            <Link page="ledger">ledger</Link>, every change of a balance.
          </li>
          <li>
            <Link page="accounts">Watch the account pool</Link>: health, cooldowns after failures, a test request per account.
          </li>
          <li>
            Try a limit: send more requests than a key's rpm allows and see 429 with <code>Retry-After</code> (edit limits on the{' '}
            <Link page="keys">Keys</Link> page).
          </li>
          <li>
            Bring your own provider: <Link page="accounts">add an account</Link> with its base URL and API key to a group, and give
            your models a <Link page="prices">price</Link>.
          </li>
        </ul>
      </section>
    );
  }

  return (
    <section class="card guide" data-testid="guide" data-state="setup" aria-labelledby="guide-title">
      <div class="guide-head">
        <h2 id="guide-title">Get started: {steps.filter((x) => !x.done).length} steps to a first billed request</h2>
        <button type="button" class="small" onClick={hide}>
          Hide this guide
        </button>
      </div>
      <ol class="guide-steps">
        {steps.map((x) => (
          <li key={x.id} data-step={x.id} data-done={x.done ? 'true' : 'false'} class={x.done ? 'done' : x === next ? 'next' : ''}>
            <span class="guide-mark" aria-hidden="true">
              {x.done ? '✓' : ''}
            </span>
            <div>
              <strong>
                {x.title}
                {x.done && <span class="visually-hidden"> (done)</span>}
              </strong>
              {!x.done && x.how && <div class="muted">{x.how}</div>}
              {!x.done && x.id === 'request' && (
                <div class="muted">
                  With the key in <code>$KEY</code> (any OpenAI SDK works too, with <code>{origin}/v1</code> as its base URL):
                  <pre class="guide-code">{curl}</pre>
                </div>
              )}
              {x === next && x.id !== 'request' && (
                <div>
                  <Link page={x.page} testid="guide-next">
                    {x.action} →
                  </Link>
                </div>
              )}
            </div>
          </li>
        ))}
      </ol>
      <p class="muted">
        Or all at once from a file: <code>tollgate apply -c tollgate.lua examples/state.lua</code> (tenants, groups, accounts, keys and
        prices; the same file twice changes nothing).
      </p>
    </section>
  );
}
