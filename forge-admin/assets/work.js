// The work's pages: Crons (list, one cron with its ticks) and Jobs (list with filters and bulk
// actions, one job with each attempt's error).

import { api, query } from './api.js';
import {
  h, replace, section, badge, table, definitions, time, fmtTime, fmtDuration, relative, fmtNumber,
  button, confirmDialog, formDialog, inputError,
} from './ui.js';

const enc = encodeURIComponent;

// --- Crons -------------------------------------------------------------------------------

function cronActions(ctx, c, { onDeleted } = {}) {
  if (!ctx.canWrite()) return null;
  const verb = c.paused_at ? 'resume' : 'pause';
  return h('span', { class: 'actions' },
    button(c.paused_at ? 'Resume' : 'Pause', () => ctx.act(
      () => api(`api/crons/${enc(c.name)}/${verb}`, { method: 'POST' }),
      () => `Cron ${c.name} ${c.paused_at ? 'resumed' : 'paused'}.`,
    ), { focus: `cron-toggle-${c.name}`, action: `${verb}-cron`, kind: 'write' }),
    ' ',
    button('Trigger now', () => ctx.act(
      () => api(`api/crons/${enc(c.name)}/trigger`, { method: 'POST' }),
      (r) => `Cron ${c.name} triggered: a manual tick at ${fmtTime(r.scheduled_at, { ms: true })} runs on the ${c.role} leader.`,
    ), { focus: `cron-trigger-${c.name}`, action: 'trigger-cron', kind: 'write' }),
    c.job_kind ? [' ', button('Edit', () => cronForm(ctx, c), {
      focus: `cron-edit-${c.name}`, action: 'edit-cron', kind: 'write', title: `Change the stored cron ${c.name}`,
    }), ' ', button('Delete', () => deleteCron(ctx, c, onDeleted), {
      focus: `cron-delete-${c.name}`, action: 'delete-cron', kind: 'write', danger: true, title: `Delete the stored cron ${c.name}`,
    })] : null);
}

// A stored cron (`PUT api/crons/{name}`): a new one (`c` undefined), or a change of `c`,
// starting from what is stored. The API checks every field and says what is wrong; a name of
// a cron of code is refused (409).
function cronForm(ctx, c) {
  const o = (c && c.job_options) || {};
  const policy = (name, label, hint) => ({ name, label, value: o[name] ?? '', placeholder: 'default', hint });
  formDialog(c ? `Change cron ${c.name}` : 'New cron', [
    { name: 'name', label: 'Name', value: c ? c.name : '', readonly: Boolean(c), required: true, placeholder: 'nightly_report' },
    { name: 'expression', label: 'Expression', value: c ? c.expression : '', required: true, placeholder: '0 3 * * *',
      hint: '5 fields (minute hour day month weekday), 6 with seconds first, or @hourly, @daily, ...' },
    { name: 'timezone', label: 'Time zone', value: c && c.timezone !== 'UTC' ? c.timezone : '', placeholder: 'UTC',
      hint: 'An IANA name, such as Europe/Paris.' },
    { name: 'kind', label: 'Job kind', value: c ? c.job_kind : '', required: true, placeholder: 'send_report',
      hint: 'The kind of the job each tick enqueues (a #[job] some node registers).' },
    { name: 'args', label: 'Arguments (JSON)', value: c ? JSON.stringify(c.job_args) : '', multiline: true,
      placeholder: '{"to": "ops@example.com"}' },
    policy('catch_up', 'Catch-up', 'Ticks missed while no leader ran: skip, latest (default) or all.'),
    policy('catch_up_window', 'Catch-up window', 'How far back missed ticks are caught up, such as 1h (default 1day).'),
    policy('overlap', 'Overlap', 'A tick while the last one runs: skip, wait or allow.'),
    policy('interrupted', 'Interrupted', 'A tick cut off by its leader\'s death: rerun (default) or abandon.'),
    policy('timeout', 'Timeout', 'Bounds the enqueue of a tick, such as 30s (default none).'),
  ], async (v) => {
    if (!v.name) throw inputError('A cron needs a name.', 'name');
    const body = { expression: v.expression, kind: v.kind };
    if (v.args) {
      try {
        body.args = JSON.parse(v.args);
      } catch (err) {
        throw inputError(`The arguments must be JSON, such as {"to": "ops@example.com"}: ${err.message}`, 'args');
      }
    }
    for (const key of ['timezone', 'catch_up', 'catch_up_window', 'overlap', 'interrupted', 'timeout']) {
      if (v[key]) body[key] = v[key];
    }
    await ctx.act(() => api(`api/crons/${enc(v.name)}`, { method: 'PUT', body }),
      (r) => `Cron ${v.name}: ${r.result}.`, { inForm: true });
    if (!c) ctx.navigate(`#/crons/${enc(v.name)}`);
  }, { submitLabel: c ? 'Save changes' : 'Create', action: 'save-cron' });
}

async function deleteCron(ctx, c, onDeleted) {
  const yes = await confirmDialog(`Delete cron ${c.name}?`,
    `The stored cron ${c.name} stops: no tick of it enqueues a job any more (its ledger of ticks stays until [cron] ledger_retention).`, 'Delete');
  if (!yes) return;
  const ok = await ctx.act(() => api(`api/crons/${enc(c.name)}`, { method: 'DELETE' }), () => `Cron ${c.name} deleted.`);
  if (ok && onDeleted) onDeleted();
}

function cronStatus(c) {
  const parts = [];
  if (c.paused_at) {
    parts.push(h('span', { title: `paused ${c.paused_at} by ${c.paused_by || '?'}` }, badge('paused', 'warn')));
  }
  if (c.trigger_requested_at) {
    parts.push(' ', h('span', { title: c.trigger_requested_at }, badge('trigger pending', 'info')));
  }
  return parts.length ? parts : badge('scheduled', 'good');
}

export function crons(ctx) {
  if (ctx.rest[0]) return cronDetail(ctx, ctx.rest[0]);
  const list = h('div');
  const create = ctx.canWrite()
    ? h('p', {}, button('New cron', () => cronForm(ctx), {
      focus: 'new-cron', action: 'new-cron', kind: 'write', title: 'Create a cron stored in the database',
    }))
    : null;
  ctx.root.append(section('Crons', {}, create, list));
  return {
    async update() {
      const data = await api('api/crons');
      const write = ctx.canWrite();
      replace(list, table(
        [{ title: 'Cron' }, { title: 'Role' }, { title: 'Schedule' }, { title: 'Next run' }, { title: 'Last run' },
          { title: 'Outcome' }, { title: 'Lag', class: 'num' }, { title: 'Duration', class: 'num' },
          { title: 'Skipped 24h', class: 'num' }, { title: 'Missing 24h', class: 'num' }, { title: 'Status' },
          write ? { title: 'Actions' } : null].filter(Boolean),
        data.crons.map((c) => ({
          attrs: { dataset: { cron: c.name } },
          cells: [
            h('a', { href: `#/crons/${enc(c.name)}`, dataset: { focus: `cron-link-${c.name}` } }, c.name),
            c.role,
            h('span', {}, h('code', {}, c.expression), c.timezone !== 'UTC' ? ` (${c.timezone})` : ''),
            c.next_run ? h('span', { title: c.next_run, dataset: { field: 'next' } }, relative(c.next_run)) : '-',
            c.last ? time(c.last.scheduled_at) : '-',
            c.last ? [badge(c.last.state), c.last.manual ? ' manual' : '', c.last.error ? h('span', { class: 'muted', title: c.last.error }, ' ⓘ') : ''] : '-',
            h('span', { dataset: { field: 'lag' } }, c.last ? fmtDuration(c.last.lag_ms) : '-'),
            h('span', { dataset: { field: 'duration' } }, c.last ? fmtDuration(c.last.duration_ms) : '-'),
            fmtNumber(c.skipped_24h),
            c.missing_24h ? h('span', { class: 'warn-text' }, fmtNumber(c.missing_24h)) : '0',
            cronStatus(c),
            write ? cronActions(ctx, c) : null,
          ].filter((x) => x !== null),
        })),
        { empty: 'No cron is registered in this cluster.', label: 'Crons' }));
    },
  };
}

function tickTable(items) {
  return table(
    [{ title: 'Scheduled' }, { title: 'State' }, { title: 'Attempt', class: 'num' }, { title: 'Node' },
      { title: 'Epoch', class: 'num' }, { title: 'Started' }, { title: 'Lag', class: 'num' },
      { title: 'Duration', class: 'num' }, { title: 'Error or reason' }],
    items.map((t) => ({
      attrs: { dataset: { tick: t.scheduled_at, state: t.state } },
      cells: [time(t.scheduled_at, { ms: true }), [badge(t.state), t.manual ? ' manual' : ''], t.attempt, t.node_id,
        t.epoch, time(t.started_at, { ms: true }),
        h('span', { dataset: { field: 'lag', ms: t.lag_ms ?? '' } }, fmtDuration(t.lag_ms)),
        h('span', { dataset: { field: 'duration', ms: t.duration_ms ?? '' } }, fmtDuration(t.duration_ms)),
        t.error ? h('span', { class: 'error-text' }, t.error) : ''],
    })),
    { empty: 'No tick in the ledger yet.', label: 'Recent ticks, newest first' });
}

function cronDetail(ctx, name) {
  const facts = h('div');
  const ticks = h('div');
  const more = h('div', { class: 'more' });
  ctx.root.append(
    h('p', {}, h('a', { href: '#/crons' }, '← all crons')),
    section(`Cron ${name}`, {}, facts),
    section('Recent ticks', {}, ticks, more));
  let older = [];
  let cursor;
  let deleted = false;
  return {
    async update() {
      if (deleted) return;
      const data = await api(`api/crons/${enc(name)}?limit=50`);
      const c = data.cron;
      if (cursor === undefined) cursor = data.ticks.next;
      replace(facts,
        definitions([
          ['Role', c.role],
          ['Schedule', h('span', {}, h('code', {}, c.expression), ` in ${c.timezone}`)],
          ['Next run', c.next_run ? h('span', {}, time(c.next_run), ` (${relative(c.next_run)})`) : '-'],
          ['Last run', c.last ? h('span', {}, badge(c.last.state), ' ', time(c.last.scheduled_at, { ms: true }), ` on ${c.last.node_id}`) : '-'],
          ['Skipped, last 24 h', fmtNumber(c.skipped_24h)],
          ['Missing, last 24 h', fmtNumber(c.missing_24h)],
          ['Status', cronStatus(c)],
          ['Registered by', c.last_seen_by],
          ['Job', c.job_kind
            ? h('span', { dataset: { field: 'job' } }, 'stored in the database: enqueues ', h('code', {}, c.job_kind), ' ',
              h('code', {}, JSON.stringify(c.job_args)))
            : h('span', { dataset: { field: 'job' } }, 'defined in code: its schedule and job change in the code, '
              + 'with a deploy. Here it can be paused, resumed and triggered; the API refuses to change or delete it.')],
        ]),
        cronActions(ctx, c, { onDeleted: () => { deleted = true; ctx.navigate('#/crons'); } }));
      const seen = new Set();
      const items = [...data.ticks.items, ...older].filter((t) => (seen.has(t.scheduled_at) ? false : seen.add(t.scheduled_at)));
      replace(ticks, tickTable(items));
      replace(more, cursor ? button('Load older ticks', async () => {
        const page = await api(`api/crons/${enc(name)}/ticks${query({ limit: 100, before: cursor })}`);
        older = older.concat(page.items);
        cursor = page.next;
        ctx.refresh();
      }, { focus: 'older-ticks' }) : null);
    },
  };
}

// --- Jobs --------------------------------------------------------------------------------

function jobActions(ctx, job, { onDeleted } = {}) {
  if (!ctx.canWrite()) return null;
  // What the job's state allows, as the API computes it (it refuses the others with a 409).
  const can = job.actions;
  const id = job.id;
  return h('span', { class: 'actions' },
    can.retry ? button('Retry', () => ctx.act(
      () => api(`api/jobs/${id}/retry`, { method: 'POST' }),
      () => `Job ${id} retried: available now.`,
    ), { focus: `retry-${id}`, action: 'retry', kind: 'write', title: `Retry job ${id} now` }) : null,
    can.cancel ? [' ', button('Cancel', () => ctx.act(
      () => api(`api/jobs/${id}/cancel`, { method: 'POST' }),
      () => (job.state === 'running' ? `Job ${id}: its node was asked to stop it.` : `Job ${id} cancelled.`),
    ), { focus: `cancel-${id}`, action: 'cancel', kind: 'write', title: `Cancel job ${id}` })] : null,
    can.delete ? [' ', button('Delete', async () => {
      if (!(await confirmDialog(`Delete job ${id}?`, `Job ${id} (${job.kind}, ${job.state}) is removed for good.`, 'Delete'))) return;
      const ok = await ctx.act(() => api(`api/jobs/${id}`, { method: 'DELETE' }), () => `Job ${id} deleted.`);
      if (ok && onDeleted) onDeleted();
    }, { focus: `delete-${id}`, action: 'delete', kind: 'write', danger: true, title: `Delete job ${id}` })] : null);
}

function lastError(job) {
  const last = job.errors[job.errors.length - 1];
  if (!last) return '';
  const text = `${last.reason}: ${last.error}`;
  return h('span', { class: 'error-text', title: text }, text.length > 90 ? `${text.slice(0, 87)}...` : text);
}

function filterText(f) {
  const parts = [];
  if (f.state) parts.push(`state ${f.state}`);
  if (f.queue) parts.push(`queue ${f.queue}`);
  if (f.kind) parts.push(`kind ${f.kind}`);
  if (f.args) parts.push(`arguments containing ${f.args}`);
  return parts.length ? parts.join(', ') : 'no filter: every job in the cluster';
}

export function jobs(ctx) {
  if (ctx.rest[0]) return jobDetail(ctx, ctx.rest[0]);
  const p = ctx.params;
  const filter = { state: p.get('state') || '', queue: p.get('queue') || '', kind: p.get('kind') || '', args: p.get('args') || '' };
  const before = p.get('before') || '';

  const tabs = h('ul', { class: 'tabs' });
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter jobs' },
    h('label', { class: 'field' }, h('span', {}, 'Queue'),
      h('input', { name: 'queue', id: 'f-queue', value: filter.queue, placeholder: 'any', autocomplete: 'off' })),
    h('label', { class: 'field' }, h('span', {}, 'Kind'),
      h('input', { name: 'kind', id: 'f-kind', value: filter.kind, placeholder: 'any', autocomplete: 'off' })),
    h('label', { class: 'field wide' }, h('span', {}, 'Arguments contain (JSON)'),
      h('input', { name: 'args', id: 'f-args', value: filter.args, placeholder: '{"customer": 42}', autocomplete: 'off', spellcheck: 'false' })),
    h('button', { type: 'submit', class: 'primary' }, 'Filter'),
    h('button', { type: 'reset' }, 'Clear'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const data = new FormData(form);
    const args = data.get('args').trim();
    if (args) {
      try {
        JSON.parse(args);
      } catch (err) {
        ctx.flash(`The arguments filter must be JSON, such as {"customer": 42}: ${err.message}`, 'error');
        return;
      }
    }
    ctx.setParams({ state: filter.state, queue: data.get('queue').trim(), kind: data.get('kind').trim(), args });
  });
  form.addEventListener('reset', (e) => {
    e.preventDefault();
    ctx.setParams({ state: filter.state });
  });

  const bulk = h('div', { class: 'bulk' });
  if (ctx.canWrite()) {
    const run = (action, verb) => async () => {
      const what = filterText(filter);
      // The states the action leaves alone, as the API says (`GET /api/meta`).
      const applies = (ctx.meta.job_actions.find((a) => a.action === action) || { states: [] }).states;
      const spared = ctx.meta.job_states.filter((s) => !applies.includes(s));
      const yes = await confirmDialog(`${verb} every matching job?`,
        `${verb} every job matching ${what} - all of them, not only those listed here, in batches of 1,000.`
        + (spared.length ? ` Jobs that are ${spared.join(' or ')} are left alone.` : ''),
        `${verb} all matching`);
      if (!yes) return;
      const body = {};
      if (filter.state) body.state = filter.state;
      if (filter.queue) body.queue = filter.queue;
      if (filter.kind) body.kind = filter.kind;
      if (filter.args) body.args = JSON.parse(filter.args);
      if (!Object.keys(body).length) body.all = true;
      await ctx.act(() => api(`api/jobs/bulk/${action}`, { method: 'POST', body }),
        (r) => `${verb}: ${fmtNumber(r.affected)} job${r.affected === 1 ? '' : 's'} matching ${what}.`);
    };
    // One button per action the API has (`GET /api/meta`); deleting is the one not undone.
    bulk.append(h('span', { class: 'muted' }, 'Everything matching the filter: '),
      ...ctx.meta.job_actions.flatMap(({ action }, i) => {
        const verb = `${action[0].toUpperCase()}${action.slice(1)}`;
        const one = button(`${verb} all`, run(action, verb),
          { action: `bulk-${action}`, kind: 'write', danger: action === 'delete' });
        return i ? [' ', one] : [one];
      }));
  }
  const list = h('div');
  const more = h('div', { class: 'more' });
  ctx.root.append(section('Jobs', {}, h('nav', { 'aria-label': 'Job states' }, tabs), form, bulk, list, more));

  let limit = 50;
  return {
    async update() {
      const [page, queues] = await Promise.all([
        api(`api/jobs${query({ ...filter, limit, before })}`),
        api('api/queues'),
      ]);
      const counts = {};
      for (const q of queues.queues) {
        if (filter.queue && q.queue !== filter.queue) continue;
        // A queue counts the states it holds jobs in for long (the API's QueueView).
        for (const s of ctx.meta.job_states) if (typeof q[s] === 'number') counts[s] = (counts[s] || 0) + q[s];
      }
      const link = (state, label) => {
        const params = new URLSearchParams();
        for (const [k, v] of Object.entries({ ...filter, state })) if (v) params.set(k, v);
        const text = params.toString();
        return h('li', {}, h('a', {
          href: `#/jobs${text ? `?${text}` : ''}`,
          'aria-current': filter.state === state ? 'page' : null,
          dataset: { state: state || 'all' },
        }, label, counts[state] !== undefined ? h('span', { class: 'count' }, fmtNumber(counts[state])) : null));
      };
      replace(tabs, link('', 'all'), ctx.meta.job_states.map((s) => link(s, s)));
      replace(list, table(
        [{ title: 'ID', class: 'num' }, { title: 'Kind' }, { title: 'Queue' }, { title: 'State' },
          { title: 'Attempt', class: 'num' }, { title: 'Run at' }, { title: 'Node' }, { title: 'Arguments' },
          { title: 'Last error' }, ctx.canWrite() ? { title: 'Actions' } : null].filter(Boolean),
        page.items.map((j) => ({
          attrs: { dataset: { job: j.id, state: j.state } },
          cells: [
            h('a', { href: `#/jobs/${j.id}`, dataset: { focus: `job-link-${j.id}` } }, String(j.id)),
            j.kind, j.queue, [badge(j.state), j.cancel_requested ? ' cancelling' : ''],
            `${j.attempt}${j.max_attempts ? ` / ${j.max_attempts}` : ''}`,
            time(j.run_at), j.node_id || '-',
            h('code', { class: 'detail', title: JSON.stringify(j.args) }, truncate(JSON.stringify(j.args), 60)),
            lastError(j),
            ctx.canWrite() ? jobActions(ctx, j) : null,
          ].filter((x) => x !== null),
        })),
        { empty: `No job matches ${filterText(filter)}.`, label: 'Jobs, newest first' }));
      replace(more,
        page.next && limit < 500 ? button('Show 50 more', () => {
          limit += 50;
          ctx.refresh();
        }, { focus: 'more-jobs' }) : null,
        page.next && limit >= 500 ? h('a', { href: `#/jobs${query({ ...filter, before: page.next })}` }, 'Older jobs →') : null,
        before ? [' ', h('a', { href: `#/jobs${query(filter)}` }, '↑ newest jobs')] : null);
    },
  };
}

function truncate(text, n) {
  return text.length > n ? `${text.slice(0, n - 3)}...` : text;
}

// Links to jobs by id, comma-separated (a job's parents or children).
function jobLinks(ids) {
  return ids.flatMap((id, i) => [i ? ', ' : '', h('a', { href: `#/jobs/${id}` }, String(id))]);
}

function jobDetail(ctx, idText) {
  const id = Number(idText);
  const facts = h('div');
  const attempts = h('div');
  ctx.root.append(
    h('p', {}, h('a', { href: '#/jobs' }, '← all jobs')),
    section(`Job ${idText}`, { dataset: { job: idText } }, facts),
    section('Attempts that failed', {}, attempts));
  let deleted = false;
  return {
    async update() {
      if (deleted) return;
      if (!Number.isSafeInteger(id)) throw new Error(`${idText} is not a job id`);
      const j = await api(`api/jobs/${id}`);
      replace(facts,
        definitions([
          ['State', h('span', { dataset: { field: 'state' } }, badge(j.state)), ],
          ['Kind', j.kind],
          ['Queue', h('a', { href: `#/jobs?queue=${enc(j.queue)}` }, j.queue)],
          ['Attempt', h('span', { dataset: { field: 'attempt' } }, `${j.attempt}${j.max_attempts ? ` of ${j.max_attempts}` : ''}`)],
          ['Priority', String(j.priority)],
          ['Run at', time(j.run_at, { ms: true })],
          ['Enqueued', time(j.created_at, { ms: true })],
          ['Last attempt started', time(j.attempted_at, { ms: true })],
          ['Finished', time(j.finished_at, { ms: true })],
          ['Node', j.node_id || '-'],
          j.role ? ['Role (leader-only)', j.role] : null,
          j.unique_key ? ['Unique key', j.unique_key] : null,
          j.timeout_ms ? ['Timeout', fmtDuration(j.timeout_ms)] : null,
          j.cancel_requested ? ['Cancel', 'requested: its node stops it'] : null,
          ['Arguments', h('pre', { class: 'json' }, JSON.stringify(j.args, null, 2))],
          j.output != null ? ['Output', h('pre', { class: 'json', dataset: { field: 'output' } }, JSON.stringify(j.output, null, 2))] : null,
          j.parents.length ? ['Waits for', h('span', { dataset: { field: 'parents' } }, jobLinks(j.parents),
            j.parents_left ? ` (${j.parents_left} not ended yet)` : '')] : null,
          j.children.length ? ['Waited for by', h('span', { dataset: { field: 'children' } }, jobLinks(j.children))] : null,
        ]),
        jobActions(ctx, j, { onDeleted: () => { deleted = true; ctx.navigate('#/jobs'); } }));
      replace(attempts, table(
        [{ title: 'Attempt', class: 'num' }, { title: 'At' }, { title: 'Node' }, { title: 'Reason' }, { title: 'Error' }],
        j.errors.map((e) => ({
          attrs: { dataset: { attempt: e.attempt } },
          cells: [e.attempt, time(e.at, { ms: true }), e.node || '-', badge(e.reason, e.reason === 'rescued' || e.reason === 'released' ? 'warn' : 'bad'),
            h('pre', { class: 'error-text' }, e.error)],
        })),
        { empty: 'No attempt has failed.', label: 'Failed attempts, oldest first' }));
    },
  };
}

