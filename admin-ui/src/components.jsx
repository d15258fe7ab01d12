// Building blocks shared by the pages: loading and error states, empty states that say
// what to do next, tables, forms, a confirmation dialog, and a hook for API loads.
import { createContext } from 'preact';
import { useCallback, useContext, useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';

export function Spinner({ label = 'Loading…' }) {
  return (
    <div class="spinner" role="status" aria-live="polite">
      <span class="spinner-dot" aria-hidden="true" />
      {label}
    </div>
  );
}

/** A failure the operator did not cause (network, the gateway's 5xx) says so first;
 *  a refused value is just the sentence that says what to change. */
export function ErrorBox({ error, onRetry }) {
  if (!error) return null;
  const theirs = error.status === 0 || error.status >= 500 || (!error.plain && !error.status);
  return (
    <div class="error" role="alert">
      {theirs && <strong>Something went wrong. </strong>}
      {error.plain || error.message || String(error)}
      {onRetry && (
        <button type="button" class="link" onClick={onRetry}>
          Try again
        </button>
      )}
    </div>
  );
}

export function Notice({ kind = 'info', children }) {
  return <div class={`notice notice-${kind}`}>{children}</div>;
}

export function Empty({ title, children }) {
  return (
    <div class="empty">
      <strong>{title}</strong>
      <div>{children}</div>
    </div>
  );
}

/** A page heading with an optional right-hand side (buttons). */
export function PageHead({ title, sub, children }) {
  return (
    <header class="page-head">
      <div>
        <h1>{title}</h1>
        {sub && <p class="sub">{sub}</p>}
      </div>
      <div class="page-actions">{children}</div>
    </header>
  );
}

/**
 * Runs fn() now and whenever deps change or reload() is called; returns
 * {data, error, loading, reload}. A load started later wins over an earlier one.
 */
export function useLoad(fn, deps = []) {
  const [state, setState] = useState({ data: null, error: null, loading: true });
  const seq = useRef(0);
  const reload = useCallback(async () => {
    const my = ++seq.current;
    setState((s) => ({ ...s, loading: true, error: null }));
    try {
      const data = await fn();
      if (my === seq.current) setState({ data, error: null, loading: false });
    } catch (error) {
      if (my === seq.current) setState((s) => ({ ...s, error, loading: false }));
    }
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, deps);
  useEffect(() => {
    reload();
  }, [reload]);
  return { ...state, reload };
}

/** A button that shows progress while its async onClick runs and reports failures. */
export function ActionButton({ onClick, children, busyLabel, class: cls = '', onError, ...rest }) {
  const [busy, setBusy] = useState(false);
  const click = async (e) => {
    e.preventDefault();
    if (busy) return;
    setBusy(true);
    try {
      await onClick();
    } catch (err) {
      if (onError) onError(err);
      else throw err;
    } finally {
      setBusy(false);
    }
  };
  return (
    <button type="button" class={`${cls} ${busy ? 'busy' : ''}`} disabled={busy || rest.disabled} onClick={click} {...rest}>
      {busy ? busyLabel || 'Working…' : children}
    </button>
  );
}

/** The error of the field a Form's last submit was refused for: {name, text}. */
const FieldError = createContext(null);

/** The text of an error that concerns one field, without the field's name (it is shown
 *  under the field): `field "name" must be …` → `Must be …`. */
export function fieldText(err) {
  const t = String(err.detail || err.plain || err.message || '').replace(/^field "[^"]+"\s*(item \d+ )?:?\s*/, (m, item) => (item ? `Item ${item.trim().split(' ')[1]} ` : ''));
  return t ? t[0].toUpperCase() + t.slice(1) : t;
}

/** A labelled form field; shows the Form's error next to it when it concerns its input. */
export function Field({ label, hint, children, wide }) {
  const fe = useContext(FieldError);
  const name = children?.props?.name;
  const err = fe && name && fe.name === name ? fe.text : null;
  const id = name ? `err-${name}` : undefined;
  return (
    <label class={`field ${wide ? 'wide' : ''} ${err ? 'invalid' : ''}`}>
      <span class="field-label">{label}</span>
      {children}
      {err && (
        <span class="field-error" id={id} data-testid={`field-error-${name}`}>
          {err}
        </span>
      )}
      {hint && <span class="hint">{hint}</span>}
    </label>
  );
}

/**
 * A form that submits with progress and shows the API's error in plain words.
 * onSubmit(values) gets the named inputs' values as strings (checkbox groups as arrays).
 */
export function Form({ onSubmit, submitLabel = 'Save', busyLabel = 'Saving…', children, onCancel, class: cls = '' }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState(null);
  const [fieldError, setFieldError] = useState(null);
  const ref = useRef(null);
  // The refused field: marked invalid, described by its message, and focused — in the
  // same commit as the message (a layout effect: a plain effect runs after the paint, so
  // the message could be seen, and read by a screen reader, before its field is marked).
  useLayoutEffect(() => {
    const form = ref.current;
    if (!form) return;
    for (const el of form.querySelectorAll('[aria-invalid]')) {
      el.removeAttribute('aria-invalid');
      el.removeAttribute('aria-describedby');
    }
    const el = fieldError && form.elements.namedItem(fieldError.name);
    if (el && el.focus) {
      el.setAttribute('aria-invalid', 'true');
      el.setAttribute('aria-describedby', `err-${fieldError.name}`);
      el.focus();
    }
  }, [fieldError]);
  const submit = async (e) => {
    e.preventDefault();
    const form = e.currentTarget;
    const values = {};
    for (const el of form.elements) {
      if (!el.name) continue;
      if (el.type === 'checkbox') {
        if (el.dataset.multi) {
          values[el.name] = values[el.name] || [];
          if (el.checked) values[el.name].push(el.value);
        } else values[el.name] = el.checked;
      } else values[el.name] = el.value;
    }
    setBusy(true);
    setError(null);
    setFieldError(null);
    try {
      await onSubmit(values, form);
    } catch (err) {
      const name = err?.field || err?.param;
      const el = name && form.elements.namedItem(name);
      if (el && el.type !== 'hidden' && !(el instanceof RadioNodeList)) setFieldError({ name, text: fieldText(err) });
      else setError(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class={`form ${cls}`} onSubmit={submit} noValidate ref={ref}>
      <FieldError.Provider value={fieldError}>
        <div class="form-fields">{children}</div>
      </FieldError.Provider>
      <ErrorBox error={error} />
      <div class="form-actions">
        <button type="submit" class="primary" disabled={busy}>
          {busy ? busyLabel : submitLabel}
        </button>
        {onCancel && (
          <button type="button" onClick={onCancel} disabled={busy}>
            Cancel
          </button>
        )}
      </div>
    </form>
  );
}

const FOCUSABLE = 'a[href], button:not([disabled]), input:not([disabled]), select:not([disabled]), textarea:not([disabled]), [tabindex]:not([tabindex="-1"])';

/**
 * A modal dialog: children are its body; closes on Escape and on the backdrop. While it
 * is open, Tab and Shift+Tab stay inside it; when it closes, focus returns to what had
 * it before (the button that opened it), or to the page's main area if that is gone.
 */
export function Modal({ title, onClose, children, wide }) {
  const ref = useRef(null);
  const closeRef = useRef(onClose);
  closeRef.current = onClose;
  // A layout effect, not an effect: its keys and focus are in place when the dialog is in
  // the DOM, so an Escape or Tab pressed at once (a fast keyboard, a test) reaches it.
  useLayoutEffect(() => {
    const opener = document.activeElement;
    const key = (e) => {
      if (document.querySelector('.relogin')) return; // the login dialog over the page has the keys
      if (e.key === 'Escape') closeRef.current?.();
      if (e.key !== 'Tab' || !ref.current) return;
      const items = [...ref.current.querySelectorAll(FOCUSABLE)].filter((el) => el.offsetParent !== null || el === document.activeElement);
      if (!items.length) return;
      const first = items[0];
      const last = items[items.length - 1];
      const inside = ref.current.contains(document.activeElement);
      if (e.shiftKey && (document.activeElement === first || !inside)) {
        e.preventDefault();
        last.focus();
      } else if (!e.shiftKey && (document.activeElement === last || !inside)) {
        e.preventDefault();
        first.focus();
      }
    };
    document.addEventListener('keydown', key);
    (ref.current?.querySelector('input, select, textarea, button.primary') || ref.current)?.focus();
    return () => {
      document.removeEventListener('keydown', key);
      // After the page re-renders (a list reloaded), the opener may be a new element.
      setTimeout(() => {
        if (opener && opener.isConnected && opener !== document.body) opener.focus();
        else document.getElementById('main')?.focus();
      }, 0);
    };
  }, []);
  return (
    <div class="modal-backdrop" onClick={(e) => e.target === e.currentTarget && onClose?.()}>
      <div class={`modal ${wide ? 'wide' : ''}`} role="dialog" aria-modal="true" aria-labelledby="modal-title" tabIndex={-1} ref={ref}>
        <header>
          <h2 id="modal-title">{title}</h2>
          {onClose && (
            <button type="button" class="link close" aria-label="Close" onClick={onClose}>
              ×
            </button>
          )}
        </header>
        <div class="modal-body">{children}</div>
      </div>
    </div>
  );
}

/** Asks before a destructive action; runs it with progress and shows its error. */
export function Confirm({ title, children, confirmLabel = 'Confirm', danger, onConfirm, onClose }) {
  const [error, setError] = useState(null);
  return (
    <Modal title={title} onClose={onClose}>
      <div class="confirm-text">{children}</div>
      <ErrorBox error={error} />
      <div class="form-actions">
        <ActionButton
          class={danger ? 'danger' : 'primary'}
          busyLabel="Working…"
          onClick={async () => {
            setError(null);
            await onConfirm();
            onClose();
          }}
          onError={setError}
        >
          {confirmLabel}
        </ActionButton>
        <button type="button" onClick={onClose}>
          Cancel
        </button>
      </div>
    </Modal>
  );
}

/** A data table: columns [{key, label, render?(row), num?}], rows, a row key. On narrow
 *  screens it scrolls sideways with its `sticky` column (default: "name", else the
 *  first) held at the left; an "actions" column always sticks to the right. */
export function Table({ columns, rows, rowKey = (r) => r.id, empty, class: cls = '', sticky }) {
  if (!rows.length) return empty || null;
  const pin = sticky || (columns.some((c) => c.key === 'name') ? 'name' : columns[0]?.key);
  const cellClass = (c) => [c.num ? 'num' : '', c.key === pin ? 'sticky' : '', c.key === 'actions' ? 'actions' : '', c.key === 'id' ? 'col-id' : ''].filter(Boolean).join(' ');
  return (
    <div class="table-wrap" tabIndex={0} role="region" aria-label="table (scrolls sideways)">
      <table class={cls}>
        <thead>
          <tr>
            {columns.map((c) => (
              <th key={c.key} class={cellClass(c)} scope="col">
                {c.label || (c.key === 'actions' ? <span class="visually-hidden">actions</span> : '')}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>
          {rows.map((r) => (
            <tr key={rowKey(r)} data-row={rowKey(r)}>
              {columns.map((c) => (
                <td key={c.key} class={cellClass(c)} data-col={c.key}>
                  {c.render ? c.render(r) : r[c.key] ?? '—'}
                </td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** A select whose initial choice is `initial` (Preact has no defaultValue for selects). */
export function Select({ name, initial, options }) {
  return (
    <select name={name}>
      {options.map(([value, label]) => (
        <option key={value} value={value} selected={value === initial}>
          {label}
        </option>
      ))}
    </select>
  );
}

export function Badge({ kind = 'neutral', title, children }) {
  return (
    <span class={`badge badge-${kind}`} title={title}>
      {children}
    </span>
  );
}

/** Copies text to the clipboard; falls back to selecting it where the API is missing
 *  (plain http on a non-localhost address is not a secure context). */
export function CopyButton({ text, targetRef }) {
  const [done, setDone] = useState('');
  const copy = async () => {
    try {
      if (!navigator.clipboard) throw new Error('no clipboard API');
      await navigator.clipboard.writeText(text);
      setDone('Copied');
    } catch {
      const el = targetRef?.current;
      if (el) {
        el.focus();
        el.select();
        const ok = document.execCommand && document.execCommand('copy');
        setDone(ok ? 'Copied' : 'Selected: press Ctrl+C');
      } else setDone('Copy it by hand');
    }
  };
  return (
    <button type="button" class="primary" onClick={copy}>
      {done || 'Copy'}
    </button>
  );
}
