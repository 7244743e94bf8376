// The cluster's pages: Overview, Leadership, Events, Nodes.

import { api, query } from './api.js';
import {
  h, replace, section, badge, table, time, fmtTime, fmtDuration, since, relative, fmtNumber,
  json, button, confirmDialog, serverNow, formDialog, inputError,
} from './ui.js';

/** The event kinds of a group of the API's vocabulary (`GET /api/meta`), comma-separated. */
function groupKinds(meta, group) {
  const found = meta.event_groups.find((g) => g.group === group);
  return found ? found.kinds.join(',') : '';
}

/** A stable colour class for a node id, so a node keeps its colour across lanes. */
function nodeColour(node) {
  let hash = 0;
  for (const c of node || '') hash = (hash * 31 + c.charCodeAt(0)) >>> 0;
  return `c${hash % 8}`;
}

/**
 * How a tenure began: first, failover (with its gap), move (a placement handoff to a named
 * node, with its gap) or handoff (with its gap).
 */
export function tenureStart(t) {
  if (t.failover) return 'failover';
  if (t.gap_ms === null || t.gap_ms === undefined) return 'first';
  return t.moved ? 'move' : 'handoff';
}

const MARKS = { failover: '⚡', move: '⇆', handoff: '⇄' };

/**
 * A gap's colour, by its size: under a second is what a takeover or a handoff takes (good),
 * up to 5 s is slow (warn), longer is an outage of the role (bad).
 */
export function gapLevel(ms) {
  if (ms === null || ms === undefined) return 'neutral';
  if (ms < 1000) return 'good';
  if (ms < 5000) return 'warn';
  return 'bad';
}

const GAP_FROM = {
  release: 'from the release',
  lock_granted: 'from the lock grant (the old session ended then)',
  last_renewal: 'from its last renewal (at most)',
};

function startLabel(t) {
  const kind = tenureStart(t);
  if (kind === 'first') return badge('first', 'neutral');
  const level = gapLevel(t.gap_ms);
  return h('span', { class: 'start' },
    badge(kind, kind === 'failover' ? 'warn' : 'neutral'),
    ' ',
    h('span', {
      class: `gap badge ${level}`,
      title: `${fmtDuration(t.gap_ms)} without a leader, ${GAP_FROM[t.gap_from] || ''}`,
      dataset: { field: 'gap', level, from: t.gap_from || '' },
    }, `${fmtDuration(t.gap_ms)} gap`));
}

function stepDown(ctx, role) {
  return button('Step down', async () => {
    const yes = await confirmDialog(`Step down the ${role} leader?`,
      `The leader of ${role} drains its leader-only work and hands over gracefully; another node takes over. `
      + 'It is asked through the database, whichever node leads.', 'Step down');
    if (!yes) return;
    const url = `api/cluster/roles/${encodeURIComponent(role)}/step-down`;
    await ctx.act(async () => {
      try {
        return await api(url, { method: 'POST' });
      } catch (err) {
        // Refused: no standby waits, so the role would be without a leader for a while.
        if (err.status !== 409 || err.body.standbys !== 0) throw err;
        const force = await confirmDialog(`No standby for ${role}`,
          `${err.message}.`, 'Step down anyway');
        if (!force) throw err;
        return api(url, { method: 'POST', body: { force: true } });
      }
    }, (r) => `Asked the ${role} leader (epoch ${r.epoch}) to step down.`);
  }, { focus: `step-down-${role}`, action: 'step-down', kind: 'write' });
}

// --- Overview ----------------------------------------------------------------------------

function leaseCell(role) {
  if (!role.led) {
    return badge(role.state === 'released' ? 'released' : 'no leader', 'bad');
  }
  const remaining = role.lease_remaining_ms;
  const ratio = role.lease_ms > 0 ? Math.max(0, Math.min(1, remaining / role.lease_ms)) : 1;
  const level = ratio > 0.5 ? 'good' : ratio > 0.2 ? 'warn' : 'bad';
  const bar = h('span', { class: `lease-bar ${level}` });
  bar.style.width = `${Math.round(ratio * 100)}%`;
  return h('span', { class: 'lease', title: `${fmtDuration(remaining)} of a ${fmtDuration(role.lease_ms)} lease left` },
    h('span', { class: 'lease-track', 'aria-hidden': 'true' }, bar),
    h('span', {}, `${fmtDuration(remaining)} left`));
}

function cronHealth(c) {
  if (c.paused_at) return badge('paused', 'warn');
  const state = c.last && c.last.state;
  if (['failed', 'timed_out', 'abandoned'].includes(state)) return badge('failing', 'bad');
  if (c.missing_24h > 0) return badge(`${c.missing_24h} missed`, 'warn');
  if (!c.last) return badge('no run yet', 'neutral');
  return badge('ok', 'good');
}

export function overview(ctx) {
  const roles = h('div');
  const nodesBox = h('div');
  const changes = h('div');
  const queues = h('div');
  const kinds = h('div');
  const crons = h('div');
  ctx.root.append(
    section('Roles', {}, roles),
    h('div', { class: 'grid two' },
      section('Nodes', {}, nodesBox),
      section('Recent leadership changes', {}, changes)),
    section('Queues', {}, queues),
    section('Job kinds\' limits', {},
      ctx.canWrite() ? h('p', {}, button('Limit a job kind', () => kindLimitsForm(ctx), {
        focus: 'new-kind-limits', action: 'new-kind-limits', kind: 'write',
        title: 'Set the cluster-wide limits of a job kind, listed or not',
      })) : null,
      kinds),
    section('Crons', {}, crons));

  return {
    async update(status) {
      const [nodes, qs, ks, cs, history] = await Promise.all([
        api('api/cluster/nodes'),
        api('api/queues'),
        api('api/kinds/limits'),
        api('api/crons'),
        api('api/cluster/history?limit=8'),
      ]);
      const write = ctx.canWrite();
      replace(roles, table(
        [{ title: 'Role' }, { title: 'Leader' }, { title: 'Epoch', class: 'num' }, { title: 'Tenure' },
          { title: 'Lease' }, { title: 'Candidates', class: 'num' }, write ? { title: '' } : null].filter(Boolean),
        status.roles.map((r) => ({
          attrs: { dataset: { role: r.role, leader: r.leader || '' } },
          cells: [
            h('strong', {}, r.role),
            r.leader ? h('span', { class: `node ${nodeColour(r.leader)}`, dataset: { field: 'leader' } }, r.leader)
              : h('span', { class: 'muted', dataset: { field: 'leader' } }, 'none'),
            r.epoch ?? '-',
            r.since ? h('span', {}, fmtDuration(since(r.since)), h('span', { class: 'muted' }, ' since ', time(r.since))) : '-',
            leaseCell(r),
            r.candidates,
            write ? (r.led ? stepDown(ctx, r.role) : '') : null,
          ].filter((c) => c !== null),
        })),
        { empty: 'No role is expected: no node campaigns for one.', label: 'Roles and their leaders' }));

      const counts = status.nodes;
      replace(nodesBox,
        h('p', { class: 'counts' }, ['active', 'drifted', 'down', 'stopped'].map((s) => [
          h('a', { href: '#/nodes', class: `badge ${s}` }, `${counts[s] || 0} ${s}`), ' '])),
        table([{ title: 'Node' }, { title: 'State' }, { title: 'Leads' }, { title: 'Heartbeat', class: 'num' }],
          nodes.nodes.filter((n) => n.state !== 'stopped').map((n) => ({
            attrs: { dataset: { node: n.node_id } },
            cells: [h('span', { class: `node ${nodeColour(n.node_id)}` }, n.node_id), badge(n.state),
              n.leads.join(', ') || '-', `${fmtDuration(n.heartbeat_age_ms)} ago`],
          })),
          { empty: 'No live node.', label: 'Live nodes' }));

      replace(changes, history.items.length
        ? h('ol', { class: 'changes' }, history.items.map((t) => h('li', { dataset: { role: t.role, epoch: t.epoch } },
          time(t.acquired_at, { ms: true }), ' ', h('strong', {}, t.role), ' → ',
          h('span', { class: `node ${nodeColour(t.node_id)}` }, t.node_id), ` (epoch ${t.epoch}) `, startLabel(t))))
        : h('p', { class: 'empty' }, 'No leadership yet.'));

      replace(queues, table(
        [{ title: 'Queue' }, { title: 'Available', class: 'num' }, { title: 'Scheduled', class: 'num' },
          { title: 'Pending', class: 'num' }, { title: 'Running', class: 'num' }, { title: 'Retryable', class: 'num' }, { title: 'Dead', class: 'num' },
          { title: 'Oldest waiting', class: 'num' }, { title: 'State' }, { title: 'Limits' },
          write ? { title: '' } : null].filter(Boolean),
        qs.queues.map((q) => ({
          attrs: { dataset: { queue: q.queue } },
          cells: [
            h('a', { href: `#/jobs?queue=${encodeURIComponent(q.queue)}` }, q.queue),
            fmtNumber(q.available), fmtNumber(q.scheduled),
            h('span', { dataset: { field: 'pending' }, title: 'waiting for their parents' }, fmtNumber(q.pending)),
            fmtNumber(q.running), fmtNumber(q.retryable),
            q.dead ? h('a', { href: `#/jobs?state=dead&queue=${encodeURIComponent(q.queue)}`, class: 'bad-text' }, fmtNumber(q.dead)) : '0',
            q.oldest_available_age_s > 0 ? fmtDuration(q.oldest_available_age_s * 1000) : '-',
            q.paused ? badge('paused', 'warn') : badge('working', 'good'),
            queueLimits(q),
            write ? [queueAction(ctx, q), ' ', queueLimitsButton(ctx, q)] : null,
          ].filter((c) => c !== null),
        })),
        { empty: 'No queue has jobs.', label: 'Queues' }));
      replace(kinds, kindLimitsTable(ctx, ks.kinds));

      replace(crons, table(
        [{ title: 'Cron' }, { title: 'Role' }, { title: 'Next run' }, { title: 'Last run' }, { title: 'Lag', class: 'num' },
          { title: 'Health' }],
        cs.crons.map((c) => ({
          attrs: { dataset: { cron: c.name } },
          cells: [
            h('a', { href: `#/crons/${encodeURIComponent(c.name)}` }, c.name), c.role,
            c.next_run ? h('span', { title: c.next_run }, relative(c.next_run)) : '-',
            c.last ? h('span', {}, badge(c.last.state), ' ', time(c.last.scheduled_at)) : '-',
            c.last ? fmtDuration(c.last.lag_ms) : '-',
            cronHealth(c),
          ],
        })),
        { empty: 'No cron is registered.', label: 'Crons' }));
    },
  };
}

// A queue's cluster-wide limits (set with `forge queues limit`, the API or the Limits button) and why its jobs
// wait on them.
function queueLimits(q) {
  const text = limitsText(q.limits || {}, { short: true });
  if (!text) return '-';
  const shown = h('span', { title: q.limits_set_by ? `set by ${q.limits_set_by}` : 'from forge.toml' }, text);
  return q.waiting_on ? h('span', {}, shown, ' ', badge(q.waiting_on, 'warn')) : shown;
}

function queueAction(ctx, q) {
  const verb = q.paused ? 'resume' : 'pause';
  return button(q.paused ? 'Resume' : 'Pause', () => ctx.act(
    () => api(`api/queues/${encodeURIComponent(q.queue)}/${verb}`, { method: 'POST' }),
    () => `Queue ${q.queue} ${q.paused ? 'resumed' : 'paused'}.`,
  ), { focus: `queue-toggle-${q.queue}`, action: `${verb}-queue`, kind: 'write' });
}

// Sets or resets the cluster-wide limits of a queue or a job kind as an operator (`PUT` /
// `DELETE api/{queues|kinds}/{name}/limits`), in a form that starts from the current ones (an
// empty field: no such limit). `subject`: `key` ('queue' or 'kind': the API's parameter, and
// the form's name field when `name` is not given, for a kind not listed yet), `noun` ('Queue',
// 'Job kind'), `name`, `limits` and `setBy` (as the API lists them), `origin` (whose limits a
// reset gives back: 'forge.toml', 'forge.toml\'s or the code\'s').
function limitsForm(ctx, { key, noun, name, limits, setBy, origin }) {
  const url = (n) => `api/${key === 'queue' ? 'queues' : 'kinds'}/${encodeURIComponent(n)}/limits`;
  const l = limits || {};
  const what = noun.toLowerCase();
  formDialog(name ? `Limits of ${what} ${name}` : `Limits of a ${what}`, [
    name ? null : { name: key, label: noun, required: true, placeholder: 'send_email',
      hint: `The ${what}'s limits hold in every queue; they win over ${origin} until reset.` },
    { name: 'global_concurrency', label: 'Global concurrency', value: l.global_concurrency ?? '', placeholder: 'no limit',
      hint: 'At most this many of its jobs run at once on all nodes together.' },
    { name: 'rate', label: 'Rate', value: l.rate ?? '', placeholder: 'no limit, or such as 100/1m',
      hint: 'At most COUNT claims in any WINDOW: 100/1m, 5/1s.' },
    { name: 'rate_key', label: 'Rate key', value: l.rate_key ?? '', placeholder: `none: one rate for the ${what}`,
      hint: 'An argument field, such as customer_id: the rate holds per value of it.' },
  ].filter(Boolean), async (v) => {
    const target = name ?? v[key];
    if (!target) throw inputError(`Name the ${what} to limit.`, key);
    const body = {};
    if (v.global_concurrency) {
      const n = Number(v.global_concurrency);
      if (!/^[0-9]+$/.test(v.global_concurrency) || !Number.isSafeInteger(n)) {
        throw inputError(`Global concurrency must be a whole number, such as 4, not "${v.global_concurrency}" (empty: no limit).`,
          'global_concurrency');
      }
      body.global_concurrency = n;
    }
    if (v.rate) body.rate = v.rate;
    if (v.rate_key) body.rate_key = v.rate_key;
    await ctx.act(() => api(url(target), { method: 'PUT', body }),
      (r) => `${noun} ${target}: ${limitsText(r.limits) || 'no limits'}, from the next claim on every node.`, { inForm: true });
  }, {
    submitLabel: 'Set limits',
    action: `save-${key}-limits`,
    more: setBy ? [{
      label: `Reset to ${origin}`,
      action: `reset-${key}-limits`,
      run: () => ctx.act(() => api(url(name), { method: 'DELETE' }),
        () => `${noun} ${name}: limits given back to ${origin}.`, { inForm: true }),
    }] : [],
  });
}

function queueLimitsButton(ctx, q) {
  const open = () => limitsForm(ctx, {
    key: 'queue', noun: 'Queue', name: q.queue, limits: q.limits, setBy: q.limits_set_by, origin: 'forge.toml',
  });
  return button('Limits', open, {
    focus: `queue-limits-${q.queue}`, action: 'limit-queue', kind: 'write',
    title: `Set the cluster-wide limits of queue ${q.queue}`,
  });
}

// `global concurrency 4, rate 100/1m per customer` (`global 4, ...` when short), '' for none.
function limitsText(l, { short = false } = {}) {
  const parts = [];
  if (l.global_concurrency != null) parts.push(`${short ? 'global' : 'global concurrency'} ${l.global_concurrency}`);
  if (l.rate != null) parts.push(l.rate_key ? `rate ${l.rate} per ${l.rate_key}` : `rate ${l.rate}`);
  return parts.join(', ');
}

// --- Job kinds' limits (on the Overview, under the queues) ------------------------------

// A listed kind's limits, or (`k` undefined) any kind's, named in the form.
function kindLimitsForm(ctx, k) {
  limitsForm(ctx, {
    key: 'kind', noun: 'Job kind', name: k && k.kind, limits: k && k.limits, setBy: k && k.set_by, origin: 'forge.toml\'s or the code\'s',
  });
}

// Every job kind with cluster-wide limits (`GET api/kinds/limits`): its limits, who set them,
// what counts against them now.
function kindLimitsTable(ctx, kinds) {
  const write = ctx.canWrite();
  return table(
    [{ title: 'Job kind' }, { title: 'Limits' }, { title: 'Set by' }, { title: 'Running (global limit)', class: 'num' },
      { title: 'Claims in the rate window', class: 'num' }, write ? { title: '' } : null].filter(Boolean),
    kinds.map((k) => ({
      attrs: { dataset: { kind: k.kind } },
      cells: [
        h('a', { href: `#/jobs?kind=${encodeURIComponent(k.kind)}` }, k.kind),
        h('span', { dataset: { field: 'limits' } }, limitsText(k.limits, { short: true }) || '-'),
        h('span', { dataset: { field: 'set-by' } },
          k.set_by || h('span', { class: 'muted', title: 'forge.toml\'s [jobs.kinds], else the kind\'s declared options, written by a node at start' }, 'a node')),
        k.limits.global_concurrency != null
          ? h('span', { dataset: { field: 'running' } }, `${fmtNumber(k.limited_running)} of ${fmtNumber(k.limits.global_concurrency)}`,
            k.at_global_limit ? [' ', badge('at limit', 'warn')] : null)
          : '-',
        k.limits.rate != null
          ? h('span', { dataset: { field: 'claims' }, title: 'all rate keys together' }, fmtNumber(k.rate_claims),
            k.rate_limited_until ? [' ', h('span', { title: k.rate_limited_until }, badge(`full, ${relative(k.rate_limited_until)}`, 'warn'))] : null)
          : '-',
        write ? button('Limits', () => kindLimitsForm(ctx, k), {
          focus: `kind-limits-${k.kind}`, action: 'limit-kind', kind: 'write',
          title: `Set the cluster-wide limits of job kind ${k.kind}`,
        }) : null,
      ].filter((c) => c !== null),
    })),
    { empty: 'No job kind has cluster-wide limits: a kind\'s declared options or an operator set them.', label: 'Job kinds\' limits' });
}

// --- Leadership --------------------------------------------------------------------------

// 'auto': from the oldest tenure shown to now (at least a minute).
const WINDOWS = [['auto', 0], ['15m', 15], ['1h', 60], ['6h', 360], ['24h', 1440], ['7d', 10080]];

function selectBox(label, name, options, value, onChange) {
  const select = h('select', { name, id: `f-${name}`, on: { change: (e) => onChange(e.target.value) } },
    options.map(([v, text]) => h('option', { value: v, selected: v === value }, text)));
  return h('label', { class: 'field' }, h('span', {}, label), select);
}

function lanes(tenures, minutes) {
  const now = serverNow();
  const oldest = Math.min(now, ...tenures.map((t) => new Date(t.acquired_at).getTime()));
  const span = minutes ? minutes * 60000 : Math.max(60000, (now - oldest) * 1.04);
  const start = now - span;
  const pct = (t) => ((t - start) / span) * 100;
  const roles = [...new Set(tenures.map((t) => t.role))].sort();
  if (!roles.length) return h('p', { class: 'empty' }, 'No leadership in this window.');
  const axis = h('div', { class: 'lane-axis', 'aria-hidden': 'true' },
    [0, 0.25, 0.5, 0.75, 1].map((f) => {
      const tick = h('span', { class: 'tick' }, f === 1 ? 'now' : fmtTime(new Date(start + f * span).toISOString()));
      tick.style.left = `${f * 100}%`;
      return tick;
    }));
  return h('div', { class: 'lanes' },
    roles.map((role) => {
      const own = tenures.filter((t) => t.role === role)
        .sort((a, b) => new Date(a.acquired_at) - new Date(b.acquired_at));
      const lane = h('div', { class: 'lane-track' });
      let failovers = 0;
      let handoffs = 0;
      for (const t of own) {
        const begin = new Date(t.acquired_at).getTime();
        const end = t.ended_at ? new Date(t.ended_at).getTime() : now;
        if (end < start) continue;
        const from = Math.max(begin, start);
        const block = h('span', {
          class: `tenure node ${nodeColour(t.node_id)} ${t.end}`,
          title: `${role} epoch ${t.epoch}: ${t.node_id}, ${fmtTime(t.acquired_at, { ms: true })} - ${t.ended_at ? fmtTime(t.ended_at, { ms: true }) : 'now'} (${t.end})`,
        }, `${t.node_id} · ${t.epoch}`);
        block.style.left = `${pct(from)}%`;
        block.style.width = `${Math.max(0.4, pct(end) - pct(from))}%`;
        lane.appendChild(block);
        const kind = tenureStart(t);
        if (kind !== 'first' && begin >= start) {
          if (kind === 'failover') failovers += 1;
          else handoffs += 1;
          const marker = h('span', {
            class: `marker ${kind} ${gapLevel(t.gap_ms)}`,
            title: `${kind}${t.moved ? ` (${t.moved})` : ''} to ${t.node_id} (epoch ${t.epoch}): ${fmtDuration(t.gap_ms)} without a leader, ${GAP_FROM[t.gap_from] || ''}`,
          }, `${MARKS[kind]} ${fmtDuration(t.gap_ms)}`);
          const at = pct(begin);
          marker.style.left = `${at}%`;
          // Near an edge the label hangs inwards instead of being cut off.
          if (at > 85) marker.classList.add('right');
          else if (at < 15) marker.classList.add('left');
          lane.appendChild(marker);
        }
      }
      return h('div', { class: 'lane', dataset: { role } },
        h('div', { class: 'lane-name' }, role),
        h('div', {
          class: 'lane-body', role: 'img',
          'aria-label': `${role}: ${own.length} tenures, ${failovers} failovers and ${handoffs} handoffs in the window`,
        }, lane));
    }),
    h('div', { class: 'lane' }, h('div', { class: 'lane-name' }), axis),
    h('p', { class: 'legend' }, '⚡ failover: the leader died or froze; the gap counts from the lock grant when a standby '
      + 'took over at once, else from its last renewal (at most). ⇄ handoff: a graceful release; the gap counts from it. '
      + '⇆ move: a handoff to the node placement named (spreading the roles, or a node that prefers the role). '
      + 'The gap is ', badge('under 1 s', 'good'), ' ', badge('1-5 s', 'warn'), ' ', badge('5 s or more', 'bad'),
      '. Hatched: a tenure that was lost.'));
}

export function leadership(ctx) {
  const minutes = Number((WINDOWS.find(([k]) => k === ctx.params.get('window')) || WINDOWS[0])[1]);
  const roleFilter = ctx.params.get('role') || '';
  const lanesBox = h('div');
  const tenuresBox = h('div');
  const eventsBox = h('div');
  const roleSelect = h('span');
  ctx.root.append(
    section('Tenures over time', {},
      h('div', { class: 'filters' },
        selectBox('Window', 'window', WINDOWS.map(([k]) => [k, k === 'auto' ? 'all shown' : `last ${k}`]),
          WINDOWS.find(([, m]) => m === minutes)[0],
          (v) => ctx.setParams({ window: v, role: roleFilter })),
        roleSelect),
      lanesBox),
    section('Tenures', {}, tenuresBox),
    section('Election events', {}, eventsBox));
  let knownRoles = '';

  return {
    async update() {
      const [history, events] = await Promise.all([
        api(`api/cluster/history${query({ limit: 500, role: roleFilter })}`),
        api(`api/cluster/events${query({ kind: groupKinds(ctx.meta, 'leadership'), limit: 50, role: roleFilter })}`),
      ]);
      const roles = [...new Set([...(ctx.status() || { roles: [] }).roles.map((r) => r.role),
        ...history.items.map((t) => t.role)])].sort();
      if (roles.join() !== knownRoles) {
        knownRoles = roles.join();
        replace(roleSelect, selectBox('Role', 'role', [['', 'all roles'], ...roles.map((r) => [r, r])], roleFilter,
          (v) => ctx.setParams({ window: ctx.params.get('window'), role: v })));
      }
      replace(lanesBox, lanes(history.items, minutes));
      replace(tenuresBox, table(
        [{ title: 'Role' }, { title: 'Epoch', class: 'num' }, { title: 'Leader' }, { title: 'Began' },
          { title: 'How it began' }, { title: 'Ended' }, { title: 'How it ended' }, { title: 'Held for', class: 'num' }],
        history.items.map((t) => ({
          attrs: {
            class: `tenure-row ${tenureStart(t)}`,
            dataset: { role: t.role, epoch: t.epoch, node: t.node_id, start: tenureStart(t), gapMs: t.gap_ms ?? '' },
          },
          cells: [
            t.role, t.epoch, h('span', { class: `node ${nodeColour(t.node_id)}`, dataset: { field: 'leader' } }, t.node_id),
            time(t.acquired_at, { ms: true }), startLabel(t),
            t.ended_at ? time(t.ended_at, { ms: true }) : '-',
            badge(t.end === 'current' ? 'current' : t.end, t.end === 'lost' ? 'bad' : t.end === 'current' ? 'good' : 'neutral'),
            fmtDuration((t.ended_at ? Date.parse(t.ended_at) : serverNow()) - Date.parse(t.acquired_at)),
          ],
        })),
        { empty: 'No tenure yet.', label: 'Tenures, newest first' }));
      replace(eventsBox, eventTable(events.items));
    },
  };
}

// --- Events ------------------------------------------------------------------------------

function eventTable(items) {
  return table(
    [{ title: '#', class: 'num' }, { title: 'When' }, { title: 'Kind' }, { title: 'Node' }, { title: 'Role' },
      { title: 'Epoch', class: 'num' }, { title: 'Detail' }],
    items.map((e) => ({
      attrs: { dataset: { event: e.id, kind: e.kind } },
      cells: [e.id, time(e.at, { ms: true }), badge(e.kind, e.kind.replace(/_.*/, '')), h('span', { class: 'nowrap' }, e.node_id || '-'),
        e.role || '-', e.epoch ?? '-', eventDetail(e)],
    })),
    { empty: 'No event matches.', label: 'Events, newest first' });
}

function eventDetail(e) {
  const d = e.detail || {};
  const parts = [];
  if (e.kind === 'leader_elected') {
    parts.push(d.failover ? badge('failover', 'warn') : null);
    if (d.gap_ms !== undefined && d.gap_ms !== null) {
      parts.push(' ', badge(`${fmtDuration(d.gap_ms)} gap`, gapLevel(d.gap_ms)), ' ');
    }
  }
  const text = json(d);
  if (text) parts.push(h('code', { class: 'detail', title: text }, text.length > 160 ? `${text.slice(0, 157)}...` : text));
  return parts.filter(Boolean);
}

export function events(ctx) {
  const params = ctx.params;
  const form = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter events' },
    h('label', { class: 'field' }, h('span', {}, 'Kind'),
      h('select', { name: 'kind', id: 'f-kind' },
        h('option', { value: '' }, 'all kinds'),
        ctx.meta.event_groups.filter((g) => g.kinds.length > 1).map((g) => {
          const kinds = g.kinds.join(',');
          return h('option', { value: kinds, selected: params.get('kind') === kinds }, `${g.group} (${g.kinds.length} kinds)`);
        }),
        ctx.meta.event_kinds.map((k) => h('option', { value: k, selected: params.get('kind') === k }, k)))),
    h('label', { class: 'field' }, h('span', {}, 'Node'),
      h('input', { name: 'node', id: 'f-node', value: params.get('node') || '', placeholder: 'node id', autocomplete: 'off' })),
    h('label', { class: 'field' }, h('span', {}, 'Role'),
      h('input', { name: 'role', id: 'f-role', value: params.get('role') || '', placeholder: 'role', autocomplete: 'off' })),
    h('button', { type: 'submit', class: 'primary' }, 'Filter'),
    h('button', { type: 'reset' }, 'Clear'));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    const data = new FormData(form);
    ctx.setParams({ kind: data.get('kind'), node: data.get('node').trim(), role: data.get('role').trim() });
  });
  form.addEventListener('reset', (e) => {
    e.preventDefault();
    ctx.setParams({});
  });
  const list = h('div');
  const more = h('div', { class: 'more' });
  ctx.root.append(section('Events', {}, form, list, more));

  let older = [];
  let cursor = null;
  let first = true;
  const filter = { kind: params.get('kind'), node: params.get('node'), role: params.get('role') };

  function render(newest) {
    const seen = new Set();
    const items = [...newest, ...older].filter((e) => (seen.has(e.id) ? false : seen.add(e.id)))
      .sort((a, b) => b.id - a.id);
    replace(list, eventTable(items));
    replace(more, cursor !== null
      ? button('Load older events', async () => {
        const page = await api(`api/cluster/events${query({ ...filter, limit: 100, before: cursor })}`);
        older = older.concat(page.items);
        cursor = page.next;
        ctx.refresh();
      }, { focus: 'older-events' })
      : null);
  }

  return {
    async update() {
      const page = await api(`api/cluster/events${query({ ...filter, limit: 100 })}`);
      if (first) {
        cursor = page.next;
        first = false;
      }
      render(page.items);
    },
  };
}

// --- Nodes -------------------------------------------------------------------------------

export function nodes(ctx) {
  const summary = h('div');
  const list = h('div');
  ctx.root.append(section('Nodes', {}, summary, list));
  return {
    async update() {
      const data = await api('api/cluster/nodes');
      const counts = data.counts;
      replace(summary, h('p', { class: 'counts' },
        ['active', 'drifted', 'down', 'stopped'].map((s) => [badge(`${counts[s] || 0} ${s}`, s), ' '])));
      const order = { active: 0, drifted: 1, down: 2, stopped: 3 };
      const sorted = [...data.nodes].sort((a, b) => (order[a.state] - order[b.state]) || a.node_id.localeCompare(b.node_id));
      replace(list, table(
        [{ title: 'Node' }, { title: 'State' }, { title: 'Roles (leads in bold)' }, { title: 'Heartbeat', class: 'num' },
          { title: 'Version' }, { title: 'Host' }, { title: 'PID', class: 'num' }, { title: 'Started' },
          { title: 'Queues' }, { title: 'Admin' }, { title: 'Note' }],
        sorted.map((n) => ({
          attrs: { dataset: { node: n.node_id, state: n.state } },
          cells: [
            h('span', { class: `node ${nodeColour(n.node_id)}` }, n.node_id),
            h('span', { dataset: { field: 'state' } }, badge(n.state)),
            h('span', { dataset: { field: 'roles' } },
              n.roles.length ? n.roles.map((r, i) => [i ? ', ' : '', n.leads.includes(r) ? h('strong', { title: 'leads' }, `★ ${r}`) : r]) : '-'),
            h('span', {
              class: n.heartbeat_age_ms > 5000 && n.state === 'active' ? 'warn-text' : '',
              dataset: { field: 'heartbeat', ageMs: Math.round(n.heartbeat_age_ms) },
            }, `${fmtDuration(n.heartbeat_age_ms)} ago`),
            h('span', { dataset: { field: 'version' } }, n.version || '-'),
            n.hostname || '-', n.pid ?? '-', time(n.started_at),
            json(n.queues) || '-',
            n.admin_url && /^https?:\/\//.test(n.admin_url) ? h('a', { href: n.admin_url, rel: 'noopener noreferrer' }, n.admin_url) : '-',
            n.down_reason ? `down: ${n.down_reason}` : n.stopped_at ? h('span', {}, 'stopped ', time(n.stopped_at)) : '',
          ],
        })),
        { empty: 'No node has joined.', label: 'Nodes' }));
    },
  };
}
