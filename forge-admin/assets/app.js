// The dashboard's shell: hash routing between the pages, live updates (polling, with a pause
// control and an interval), the access mode (token, read-only), the token dialog, messages.

import { api, token, setToken } from './api.js';
import { h, replace, describe, fmtTime, fmtDuration, setServerNow, serverNow } from './ui.js';
import { overview, leadership, events, nodes } from './pages.js';
import { crons, jobs } from './work.js';
import { charts } from './charts.js';

const PAGES = { overview, leadership, events, nodes, crons, jobs, charts };

const $ = (id) => document.getElementById(id);

const app = {
  access: { writes: 'unknown', reads: 'open' },
  live: true,
  interval: 2000,
  page: null,
  pageRoot: null,
  route: null,
  timer: null,
  running: false,
  again: false,
  status: null,
  // The server's now of the last answer the page shows.
  updated: null,
  // The API's vocabulary (`GET /api/meta`): event kinds and their groups, job states, job
  // actions and the states each applies to. Pages render it; they keep no copy of their own.
  meta: { event_kinds: [], event_groups: [], job_states: [], job_actions: [] },
};

// --- messages ----------------------------------------------------------------------------

let flashTimer = null;

/** A short message under the header (announced politely to screen readers). */
function flash(text, kind = 'ok') {
  const box = $('flash');
  replace(box, h('p', { class: `message ${kind}` }, text));
  clearTimeout(flashTimer);
  flashTimer = setTimeout(() => replace(box), kind === 'error' ? 12000 : 5000);
}

function banner(text, kind) {
  const box = $('banner');
  if (!text) {
    box.hidden = true;
    replace(box);
    return;
  }
  box.hidden = false;
  box.className = `banner ${kind || ''}`;
  replace(box, text);
}

// --- access ------------------------------------------------------------------------------

function canWrite() {
  return app.access.writes === 'token';
}

function showAccess() {
  document.body.classList.toggle('read-only', !canWrite());
  const button = $('token-button');
  const has = Boolean(token());
  button.textContent = has ? 'Token set' : 'Token';
  button.setAttribute('aria-label', has ? 'Admin token: set for this tab (change or forget)' : 'Set the admin token');
  if (app.access.writes === 'read_only') {
    banner('Read-only: this node refuses every write ([admin] read_only = true). Actions are hidden.', 'info');
  } else if (app.access.writes === 'disabled') {
    banner('Writes are disabled: the serving node has no [admin] token. Actions are hidden.', 'info');
  } else {
    banner(null);
  }
}

async function loadAccess() {
  try {
    const config = await api('api/cluster/config');
    app.access = config.access || app.access;
    $('namespace').textContent = config.namespace || '';
    $('namespace').title = config.node_id ? `lock namespace; served by node ${config.node_id}` : 'lock namespace';
  } catch (err) {
    if (err.status === 401) {
      app.access = { writes: 'unknown', reads: 'token' };
      showAccess();
      banner('Reading needs a token here ([admin] read_token): set it with the "Token" button.', 'error');
      return false;
    }
    throw err;
  }
  showAccess();
  return true;
}

/** Loads the API's vocabulary once, before the first page is built. */
async function loadMeta() {
  app.meta = await api('api/meta');
}

/** Opens the token dialog; resolves true when a token was saved. */
function askToken(why) {
  const dialog = $('token-dialog');
  $('token-why').textContent = why
    || 'Actions (pause, retry, step-down, ...) need the node\'s [admin] token. It is kept in this tab only (sessionStorage) and sent as Authorization: Bearer.';
  $('token-input').value = '';
  return new Promise((resolve) => {
    const done = () => {
      dialog.removeEventListener('close', done);
      if (dialog.returnValue === 'save' && $('token-input').value.trim()) {
        setToken($('token-input').value.trim());
        flash('Token saved for this tab.');
        resolve(true);
      } else {
        if (dialog.returnValue === 'forget') {
          setToken('');
          flash('Token forgotten.');
        }
        resolve(false);
      }
      $('token-input').value = '';
      showAccess();
      refresh();
    };
    dialog.addEventListener('close', done);
    dialog.returnValue = '';
    if (!dialog.open) dialog.showModal();
    $('token-input').focus();
  });
}

/**
 * Runs a write: asks for the token first when none is set, reports the outcome, refreshes.
 * `fn` performs the request; `done(result)` says what happened. Resolves true when applied.
 * With `inForm` (a form dialog shows the error next to the operator's input), a failure
 * rejects with its error instead of flashing it (a refused token is still handled here).
 */
async function act(fn, done, { inForm = false } = {}) {
  const failed = (err) => {
    if (inForm) throw err;
    return false;
  };
  if (!canWrite()) {
    const message = 'This node refuses writes (read-only, or no [admin] token configured).';
    flash(message, 'error');
    return failed(new Error(message));
  }
  if (!token() && !(await askToken('This action needs the admin token ([admin] token).'))) {
    return failed(new Error('Not applied: the change needs the admin token ([admin] token).'));
  }
  try {
    const result = await fn();
    flash(done(result));
    return true;
  } catch (err) {
    if (err.status === 401) {
      setToken('');
      showAccess();
      flash(`${err.message}: the token was not accepted; set it again.`, 'error');
    } else if (err.status === 403) {
      flash(err.message, 'error');
      await loadAccess().catch(() => {});
    } else if (!inForm) {
      flash(describe(err), 'error');
    }
    return failed(err);
  } finally {
    refresh();
  }
}

// --- routing -----------------------------------------------------------------------------

function parseRoute() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, search] = hash.split('?');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  const name = PAGES[parts[0]] ? parts[0] : 'overview';
  return { name, rest: parts.slice(1), params: new URLSearchParams(search || ''), key: hash };
}

/** Changes the hash's query (filters) without a new history entry per keystroke. */
function setParams(params) {
  const { name, rest } = app.route;
  const path = [name, ...rest].map(encodeURIComponent).join('/');
  const search = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) search.set(k, v);
  const text = search.toString();
  location.hash = `#/${path}${text ? `?${text}` : ''}`;
}

function mount(userNavigated) {
  const route = parseRoute();
  if (app.route && app.route.key === route.key && app.page) return;
  app.route = route;
  for (const link of document.querySelectorAll('#nav a')) {
    if (link.dataset.page === route.name) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  const main = $('main');
  const errors = h('div', { id: 'page-error' });
  const body = h('div', { id: 'page', dataset: { page: route.name } });
  main.replaceChildren(errors, body);
  app.pageRoot = body;
  document.title = `${route.name[0].toUpperCase()}${route.name.slice(1)} - FORGE`;
  app.page = PAGES[route.name]({
    root: body,
    rest: route.rest,
    params: route.params,
    canWrite,
    act,
    flash,
    setParams,
    refresh,
    navigate: (hash) => { location.hash = hash; },
    status: () => app.status,
    meta: app.meta,
  });
  if (userNavigated) main.focus({ preventScroll: true });
  refresh();
}

// --- live updates ------------------------------------------------------------------------

function schedule() {
  clearTimeout(app.timer);
  app.timer = app.live ? setTimeout(refresh, app.interval) : null;
}

/** Fetches the cluster's status (the header's health) and updates the page now. */
async function refresh() {
  if (app.running) {
    app.again = true;
    return;
  }
  app.running = true;
  clearTimeout(app.timer);
  const page = app.page;
  const root = app.pageRoot;
  try {
    if (app.access.writes === 'unknown' && !(await loadAccess())) return;
    const sent = Date.now();
    app.status = await api('api/cluster/status');
    setServerNow(app.status.now, sent, Date.now());
    showOutage(null);
    showHealth(app.status);
    if (page && page.update) await page.update(app.status);
    if (page === app.page) {
      replace($('page-error'));
      if (root) root.dataset.loaded = 'true';
    }
    app.updated = app.status.now;
    $('updated').textContent = `updated ${fmtTime(app.status.now)}`;
    $('updated').classList.remove('stale');
  } catch (err) {
    $('updated').classList.add('stale');
    if (err.status === 503 && err.body.database === 'unreachable') {
      // Said once, in the banner: not again in the page.
      showOutage(err.body);
      if (page === app.page) replace($('page-error'));
    } else if (page === app.page) {
      replace($('page-error'), h('div', { class: 'error', role: 'alert' }, describe(err)));
    }
    if (err.status === 401) await loadAccess().catch(() => {});
  } finally {
    app.running = false;
    if (app.again) {
      app.again = false;
      refresh();
    } else {
      schedule();
    }
  }
}

/** The header's health: the status's problems (red), else its warnings (amber). */
function showHealth(status) {
  const health = $('health');
  const problems = status.problems || [];
  const warnings = status.warnings || [];
  const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;
  if (problems.length) {
    health.textContent = plural(problems.length, 'problem');
    health.className = 'badge bad';
  } else if (warnings.length) {
    health.textContent = plural(warnings.length, 'warning');
    health.className = 'badge warn';
  } else {
    health.textContent = 'healthy';
    health.className = 'badge good';
  }
  health.title = [...problems, ...warnings].join('\n')
    || 'every expected role has a leader, every node is active';
}

/**
 * The database outage, as the serving node reports it (a 503 with `since`): since when, and
 * how old the figures on the page are. `null` hides it.
 */
function showOutage(body) {
  const box = $('outage');
  if (!body) {
    box.hidden = true;
    replace(box);
    return;
  }
  const since = body.since ? Date.parse(body.since) : null;
  const health = $('health');
  health.textContent = 'database unreachable';
  health.className = 'badge bad';
  health.title = body.error || '';
  box.hidden = false;
  replace(box,
    h('strong', {}, 'Database unreachable'),
    since ? [` since ${fmtTime(body.since)} (${fmtDuration(serverNow() - since)})`] : null,
    ': the serving node cannot reach PostgreSQL. ',
    app.updated ? `The figures below are from ${fmtTime(app.updated)}.` : 'No figures yet.');
}

function setLive(live) {
  app.live = live;
  const button = $('live');
  button.setAttribute('aria-pressed', String(live));
  button.textContent = live ? 'Pause' : 'Resume';
  button.title = live ? 'Pause live updates (key: .)' : 'Resume live updates (key: .)';
  document.body.classList.toggle('paused', !live);
  if (live) refresh();
  else {
    clearTimeout(app.timer);
    $('updated').textContent = `paused (${$('updated').textContent.replace(/^paused \(|\)$/g, '')})`;
  }
}

// --- start -------------------------------------------------------------------------------

function start() {
  const interval = Number(sessionStorage.getItem('forge.dashboard.interval'));
  if ([1000, 2000, 5000, 10000, 30000].includes(interval)) {
    app.interval = interval;
    $('interval').value = String(interval);
  }
  $('live').addEventListener('click', () => setLive(!app.live));
  $('interval').addEventListener('change', (e) => {
    app.interval = Number(e.target.value);
    sessionStorage.setItem('forge.dashboard.interval', String(app.interval));
    schedule();
  });
  $('token-button').addEventListener('click', () => askToken());
  document.addEventListener('keydown', (e) => {
    const typing = e.target.closest('input, textarea, select, [contenteditable]');
    if (e.key === '.' && !typing && !e.ctrlKey && !e.metaKey && !e.altKey) {
      e.preventDefault();
      setLive(!app.live);
    }
  });
  window.addEventListener('hashchange', () => mount(true));
  showAccess();
  Promise.all([loadMeta(), loadAccess()])
    .catch((err) => banner(describe(err), 'error'))
    .finally(() => mount(false));
}

start();
