// DOM building without HTML strings (every value is text, never markup), formatting, and the
// small widgets the pages share.

const SVG_NS = 'http://www.w3.org/2000/svg';

function append(parent, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(parent, child);
    else if (child instanceof Node) parent.appendChild(child);
    else parent.appendChild(document.createTextNode(String(child)));
  }
}

function apply(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'class') el.setAttribute('class', value);
    else if (key === 'text') el.textContent = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'on') for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
    else if (key === 'style') Object.assign(el.style, value);
    else if (value === true) el.setAttribute(key, '');
    else el.setAttribute(key, String(value));
  }
  return el;
}

/** An HTML element: h('td', { class: 'num' }, 'text', node, [more]). */
export function h(tag, attrs, ...children) {
  const el = apply(document.createElement(tag), attrs);
  append(el, children);
  return el;
}

/** An SVG element. */
export function s(tag, attrs, ...children) {
  const el = apply(document.createElementNS(SVG_NS, tag), attrs);
  append(el, children);
  return el;
}

/**
 * Replaces a region's content, keeping the keyboard focus on the element with the same
 * `data-focus` key (live updates must not throw a keyboard user out of a table).
 */
export function replace(region, ...children) {
  const active = document.activeElement;
  const keyed = active && region.contains(active) && active.closest('[data-focus]');
  const key = keyed ? keyed.dataset.focus : null;
  region.replaceChildren();
  append(region, children);
  if (key) {
    const again = [...region.querySelectorAll('[data-focus]')].find((e) => e.dataset.focus === key);
    if (again) again.focus({ preventScroll: true });
  }
}

export function section(title, attrs, ...children) {
  const id = `h-${title.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`;
  return h('section', { class: 'card', 'aria-labelledby': id, ...attrs },
    h('h2', { id }, title), ...children);
}

export function badge(text, kind) {
  return h('span', { class: `badge ${kind || text}` }, text);
}

/**
 * A table: columns [{ title, class }], rows [{ cells: [...], attrs }]; an empty list shows
 * `empty` instead. Wrapped so that a wide table scrolls on a phone instead of the page.
 */
export function table(columns, rows, { empty = 'Nothing here.', caption, label } = {}) {
  if (!rows.length) return h('p', { class: 'empty' }, empty);
  return h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': label || caption || 'table' },
    h('table', {},
      caption ? h('caption', { class: 'sr-only' }, caption) : null,
      h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col', class: c.class }, c.title)))),
      h('tbody', {}, rows.map((row) => h('tr', row.attrs || {},
        row.cells.map((cell, i) => h('td', { class: columns[i] && columns[i].class }, cell)))))));
}

export function definitions(pairs) {
  return h('dl', { class: 'facts' }, pairs.filter(Boolean).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v ?? '-')]));
}

export function errorBox(err) {
  return h('div', { class: 'error', role: 'alert' }, describe(err));
}

/** What went wrong, in a sentence an operator can act on. */
export function describe(err) {
  if (!err) return '';
  if (err.status === 0) return err.message;
  if (err.status === 401) return `${err.message} - set the token (button "Token").`;
  return err.status ? `${err.message} (HTTP ${err.status})` : String(err.message || err);
}

// --- time and numbers ------------------------------------------------------------------

// The server's clock minus this browser's, in milliseconds: relative times ("3 s ago", "in
// 2 s") count from the server's now, never from a browser clock that may be off.
let clockOffset = 0;

/**
 * Sets the server's clock from an answer's `now` (the database's clock, ISO 8601), read
 * between `sent` and `received` (this browser's Date.now()): the server read it about halfway.
 */
export function setServerNow(iso, sent, received) {
  const at = Date.parse(iso);
  if (!Number.isNaN(at)) clockOffset = at - (sent + received) / 2;
}

/** The server's now, in milliseconds since the epoch. */
export function serverNow() {
  return Date.now() + clockOffset;
}

export function parseTime(iso) {
  return iso ? new Date(iso) : null;
}

const pad = (n, w = 2) => String(n).padStart(w, '0');

/** A local date and 24-hour time, the date left out when it is today. */
export function fmtTime(iso, { ms = false } = {}) {
  const d = parseTime(iso);
  if (!d || Number.isNaN(d.getTime())) return '-';
  const now = new Date(serverNow());
  let text = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  if (ms) text += `.${pad(d.getMilliseconds(), 3)}`;
  if (d.toDateString() !== now.toDateString()) {
    text = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${text}`;
  }
  return text;
}

/** A <time> element with the full instant as its title. */
export function time(iso, opts) {
  if (!iso) return '-';
  return h('time', { datetime: iso, title: iso }, fmtTime(iso, opts));
}

/** A duration given in milliseconds, short: 0.4 ms, 312 ms, 4.2 s, 3 min 12 s, 2 h 5 min, 3 d 4 h. */
export function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '-';
  const sign = ms < 0 ? '-' : '';
  ms = Math.abs(ms);
  if (ms < 10) return `${sign}${ms.toFixed(1)} ms`;
  if (ms < 1000) return `${sign}${Math.round(ms)} ms`;
  const sec = ms / 1000;
  if (sec < 60) return `${sign}${sec.toFixed(sec < 10 ? 2 : 1)} s`;
  const min = Math.floor(sec / 60);
  if (min < 60) return `${sign}${min} min ${Math.floor(sec % 60)} s`;
  const hours = Math.floor(min / 60);
  if (hours < 48) return `${sign}${hours} h ${min % 60} min`;
  return `${sign}${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** Milliseconds since an instant by the server's clock (negative: in the future). */
export function since(iso) {
  const d = parseTime(iso);
  return d ? serverNow() - d.getTime() : null;
}

/** "in 12 s" / "3 min ago". */
export function relative(iso) {
  const ms = since(iso);
  if (ms === null) return '-';
  return ms < 0 ? `in ${fmtDuration(-ms)}` : `${fmtDuration(ms)} ago`;
}

export function fmtNumber(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return '-';
  return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits });
}

/** A short one-line JSON. */
export function json(value) {
  if (value === null || value === undefined) return '';
  const text = JSON.stringify(value);
  return text === '{}' ? '' : text;
}

// --- actions ---------------------------------------------------------------------------

/** A button, with a key so that live updates keep the focus on it. */
export function button(label, onClick, { kind, focus, title, action, danger } = {}) {
  return h('button', {
    type: 'button',
    class: ['action', kind, danger ? 'danger' : null].filter(Boolean).join(' '),
    title,
    dataset: { ...(focus ? { focus } : {}), ...(action ? { action } : {}) },
    on: { click: onClick },
  }, label);
}

/** A modal confirmation (keyboard: Tab between the buttons, Escape cancels). */
export function confirmDialog(title, message, confirmLabel) {
  return new Promise((resolve) => {
    const dialog = h('dialog', { class: 'confirm', 'aria-labelledby': 'confirm-title' },
      h('form', { method: 'dialog' },
        h('h2', { id: 'confirm-title' }, title),
        h('p', {}, message),
        h('div', { class: 'buttons' },
          h('button', { type: 'submit', value: 'yes', class: 'primary danger', id: 'confirm-yes' }, confirmLabel),
          h('button', { type: 'submit', value: 'no', autofocus: true }, 'Cancel'))));
    dialog.addEventListener('close', () => {
      resolve(dialog.returnValue === 'yes');
      dialog.remove();
    });
    document.body.appendChild(dialog);
    dialog.showModal();
  });
}

/**
 * A modal form that makes a change (keyboard: Tab through the fields and buttons, Enter
 * submits, Escape cancels). `fields`: [{ name, label, value, placeholder, hint, required,
 * readonly, multiline }]. `submit(values)` makes the change with the fields' trimmed texts:
 * when it resolves the dialog closes; when it rejects, the dialog stays open with the
 * operator's input and says what is wrong (the API's own message), the field the error names
 * (`body.parameter`, else a field named in the message) marked invalid. `more`: other buttons
 * [{ label, action, danger, run }], each closing the dialog when `run()` resolves true.
 */
export function formDialog(title, fields, submit, { submitLabel = 'Save', action, more = [] } = {}) {
  const error = h('div', { class: 'form-error', role: 'alert', dataset: { field: 'form-error' } });
  const controls = {};
  const rows = fields.map((f) => {
    const id = `form-${f.name}`;
    const attrs = {
      name: f.name, id, placeholder: f.placeholder, required: f.required, readonly: f.readonly,
      autocomplete: 'off', spellcheck: 'false', 'aria-describedby': f.hint ? `${id}-hint` : null,
    };
    const control = f.multiline
      ? h('textarea', { ...attrs, rows: 3 }, f.value ?? '')
      : h('input', { ...attrs, value: f.value ?? '' });
    controls[f.name] = control;
    return h('div', { class: 'form-row' },
      h('label', { for: id }, f.label),
      control,
      f.hint ? h('small', { id: `${id}-hint`, class: 'muted' }, f.hint) : null);
  });
  const busy = (on) => {
    for (const b of dialog.querySelectorAll('button')) b.disabled = on;
  };
  const fail = (err) => {
    const named = (err && err.body && err.body.parameter)
      // The longest name the message mentions (catch_up_window before catch_up).
      || fields.map((f) => f.name).filter((name) => String(err && err.message).includes(name))
        .sort((a, b) => b.length - a.length)[0];
    for (const [name, control] of Object.entries(controls)) {
      if (name === named) control.setAttribute('aria-invalid', 'true');
      else control.removeAttribute('aria-invalid');
    }
    replace(error, describe(err));
    if (named && controls[named]) controls[named].focus();
  };
  const run = async (fn) => {
    busy(true);
    try {
      if (await fn()) dialog.close();
    } catch (err) {
      fail(err);
    } finally {
      busy(false);
    }
  };
  const form = h('form', { class: 'change' },
    h('h2', { id: 'form-title' }, title),
    rows,
    error,
    h('div', { class: 'buttons' },
      h('button', { type: 'submit', class: 'primary', dataset: { action: action || 'submit' } }, submitLabel),
      more.map((m) => h('button', {
        type: 'button',
        class: m.danger ? 'danger' : null,
        dataset: { action: m.action },
        on: { click: () => run(m.run) },
      }, m.label)),
      h('button', { type: 'button', dataset: { action: 'cancel-form' }, on: { click: () => dialog.close() } }, 'Cancel')));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const values = {};
    for (const f of fields) values[f.name] = controls[f.name].value.trim();
    run(async () => {
      await submit(values);
      return true;
    });
  });
  const dialog = h('dialog', { class: 'confirm form', 'aria-labelledby': 'form-title' }, form);
  dialog.addEventListener('close', () => dialog.remove());
  document.body.appendChild(dialog);
  dialog.showModal();
  const first = fields.find((f) => !f.readonly);
  if (first) controls[first.name].focus();
  return dialog;
}

/** An error of the operator's input, found before a request: shown in the form, next to `parameter`. */
export function inputError(message, parameter) {
  const err = new Error(message);
  err.body = { parameter };
  return err;
}
