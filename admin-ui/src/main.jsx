// The console's shell: login, the navigation, and a router over /admin/<page> paths
// (the gateway answers any such path with index.html, so a reload or a bookmark lands on
// the same page).
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';

import { login, logout, resumeSession, setSessionLostHandler } from './api.js';
import { Empty, ErrorBox, PageHead, Spinner } from './components.jsx';
import { Accounts } from './pages/accounts.jsx';
import { Budgets } from './pages/budgets.jsx';
import { Capacity } from './pages/capacity.jsx';
import { Dashboard } from './pages/dashboard.jsx';
import { Groups } from './pages/groups.jsx';
import { Keys } from './pages/keys.jsx';
import { Ledger } from './pages/ledger.jsx';
import { Plugins } from './pages/plugins.jsx';
import { Prices } from './pages/prices.jsx';
import { Tenants } from './pages/tenants.jsx';
import { Usage } from './pages/usage.jsx';
import { navigate } from './router.js';
import './style.css';

const PAGES = [
  { path: 'dashboard', label: 'Dashboard', component: Dashboard },
  { path: 'tenants', label: 'Tenants', component: Tenants },
  { path: 'keys', label: 'Keys', component: Keys },
  { path: 'budgets', label: 'Budgets', component: Budgets },
  { path: 'groups', label: 'Groups', component: Groups },
  { path: 'accounts', label: 'Accounts', component: Accounts },
  { path: 'prices', label: 'Prices', component: Prices },
  { path: 'plugins', label: 'Plugins', component: Plugins },
  { path: 'usage', label: 'Usage', component: Usage },
  { path: 'ledger', label: 'Ledger', component: Ledger },
  { path: 'capacity', label: 'Capacity', component: Capacity },
];

function NotFound() {
  return (
    <div>
      <PageHead title="Page not found" sub={`The console has no page at ${location.pathname}.`} />
      <Empty title="Nothing here.">
        Pick a page from the menu, or go to the{' '}
        <a href="/admin/dashboard" onClick={(e) => (e.preventDefault(), navigate('dashboard'))}>
          dashboard
        </a>
        .
      </Empty>
    </div>
  );
}

const NOT_FOUND = { path: '', label: 'Page not found', component: NotFound };

function currentPage() {
  const rest = location.pathname.replace(/^\/admin\/?/, '').replace(/\/$/, '');
  if (rest === '') return PAGES[0];
  return PAGES.find((p) => p.path === rest) || NOT_FOUND;
}

function Login({ reason, onDone }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const submit = async (e) => {
    e.preventDefault();
    const token = e.currentTarget.elements.token.value;
    if (!token) {
      setError({ plain: 'Type the admin token: it is admin_token in the config or TOLLGATE_ADMIN_TOKEN.' });
      return;
    }
    setBusy(true);
    setError(null);
    try {
      await login(token);
      onDone();
    } catch (err) {
      setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <main class="login">
      <form class="card login-card" onSubmit={submit}>
        <div class="brand big">
          <span class="logo" aria-hidden="true" />
          tollgate
        </div>
        <h1>Operator console</h1>
        {reason && <p class="notice notice-warn">{reason}</p>}
        <label class="field">
          <span class="field-label">Admin token</span>
          <input name="token" type="password" autocomplete="current-password" autofocus placeholder="admin_token of the gateway" />
        </label>
        <ErrorBox error={error} />
        <button type="submit" class="primary wide" disabled={busy}>
          {busy ? 'Checking…' : 'Log in'}
        </button>
        <p class="hint">
          The token is exchanged for a session cookie that lasts 12 hours; it is not kept in this browser.
        </p>
      </form>
    </main>
  );
}

function Shell({ onLogout }) {
  const [page, setPage] = useState(currentPage());
  const [menu, setMenu] = useState(false); // the navigation, on narrow screens
  useEffect(() => {
    const on = () => {
      setPage(currentPage());
      setMenu(false);
    };
    addEventListener('popstate', on);
    return () => removeEventListener('popstate', on);
  }, []);
  useEffect(() => {
    document.title = `${page.label} · tollgate admin`;
  }, [page]);
  const Page = page.component;
  return (
    <div class="shell">
      <a class="skip-link" href="#main">
        Skip to content
      </a>
      <nav class={`side ${menu ? 'open' : ''}`} aria-label="Console">
        <div class="brand">
          <span class="logo" aria-hidden="true" />
          tollgate
        </div>
        <button
          type="button"
          class="menu-toggle"
          aria-expanded={menu ? 'true' : 'false'}
          aria-controls="nav-pages"
          onClick={() => setMenu(!menu)}
        >
          {menu ? 'Close menu' : 'Menu'}
        </button>
        <ul id="nav-pages">
          {PAGES.map((p) => (
            <li key={p.path}>
              <a
                href={`/admin/${p.path}`}
                class={p === page ? 'active' : ''}
                aria-current={p === page ? 'page' : undefined}
                onClick={(e) => {
                  if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
                  e.preventDefault();
                  navigate(p.path);
                }}
              >
                {p.label}
              </a>
            </li>
          ))}
        </ul>
        <button type="button" class="logout" onClick={onLogout}>
          Log out
        </button>
      </nav>
      <main class="content" id="main" tabIndex={-1} key={page.path}>
        <Page />
      </main>
    </div>
  );
}

function App() {
  const [state, setState] = useState('checking'); // checking | login | in | error
  const [reason, setReason] = useState('');
  const [error, setError] = useState(null);

  const check = async () => {
    setState('checking');
    try {
      setState((await resumeSession()) ? 'in' : 'login');
    } catch (e) {
      setError(e);
      setState('error');
    }
  };
  useEffect(() => {
    // A session lost while working: the page stays (with what was typed in its forms)
    // under a login dialog; after logging in, send the form again.
    setSessionLostHandler(() => {
      setReason('Your session ended (it lasts 12 hours, and a gateway restart ends it). Log in again: what you typed is kept.');
      setState((s) => (s === 'in' || s === 'relogin' ? 'relogin' : 'login'));
    });
    check();
  }, []);

  if (state === 'checking') return <Spinner label="Connecting to the gateway…" />;
  if (state === 'error')
    return (
      <main class="login">
        <div class="card login-card">
          <ErrorBox error={error} onRetry={check} />
        </div>
      </main>
    );
  if (state === 'login')
    return (
      <Login
        reason={reason}
        onDone={() => {
          setReason('');
          setState('in');
        }}
      />
    );
  return (
    <>
      <Shell
        onLogout={async () => {
          try {
            await logout();
          } finally {
            setReason('');
            setState('login');
          }
        }}
      />
      {state === 'relogin' && (
        <div class="modal-backdrop relogin" role="dialog" aria-modal="true" aria-label="Log in again">
          <Login
            reason={reason}
            onDone={() => {
              setReason('');
              setState('in');
            }}
          />
        </div>
      )}
    </>
  );
}

const root = document.getElementById('app');
root.textContent = ''; // the boot message of index.html
render(<App />, root);
