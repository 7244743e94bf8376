// Charts of the aggregator's series (`forge.stats`, one point per `[metrics] rollup_interval`):
// job throughput, failures, durations, cron runs and lag, queue depth. SVG drawn here, no
// library; each chart has a table of its figures for screen readers and exact values.

import { api, query } from './api.js';
import { h, s, replace, section, fmtTime, fmtNumber, fmtDuration } from './ui.js';

// 'auto': the last 24 h, drawn from the oldest point on (at least 5 minutes).
const WINDOWS = [['auto', 0], ['15m', 15], ['1h', 60], ['6h', 360], ['24h', 1440], ['7d', 10080]];

const W = 640;
const H = 220;
const M = { left: 52, right: 12, top: 12, bottom: 26 };

/** Series sampled by the aggregator; every other series counts, and has no point where it counted 0. */
const SAMPLED = new Set(['queue_depth', 'oldest_job_age_seconds', 'dead_jobs']);

/** The aggregator's mark of an interval whose counters are rolled up (1 at each). */
const ROLLED = 'rollups';

/**
 * series -> label -> Map(at ms -> value). A counter has a point only at the intervals rolled up
 * (marked by `rollups`): 0 where it has no row there, nothing elsewhere - the interval in progress
 * has its samples before its counts, and an interval no aggregator rolled up is unknown, not 0.
 * (Without marks, from before they were written: the intervals where some counter has a row.)
 */
function index(points) {
  const out = new Map();
  const rolled = new Set();
  const counted = new Set();
  for (const p of points) {
    const at = new Date(p.at).getTime();
    if (p.series === ROLLED) {
      rolled.add(at);
      continue;
    }
    if (!SAMPLED.has(p.series)) counted.add(at);
    if (!out.has(p.series)) out.set(p.series, new Map());
    const byLabel = out.get(p.series);
    if (!byLabel.has(p.label)) byLabel.set(p.label, new Map());
    const byTime = byLabel.get(p.label);
    byTime.set(at, (byTime.get(at) || 0) + p.value);
  }
  const known = rolled.size ? rolled : counted;
  for (const [series, byLabel] of out) {
    if (SAMPLED.has(series)) continue;
    for (const byTime of byLabel.values()) {
      for (const t of [...byTime.keys()]) if (!known.has(t)) byTime.delete(t);
      for (const t of known) if (!byTime.has(t)) byTime.set(t, 0);
    }
  }
  return out;
}

/** One line per label of a series: [{ name, points: [[t, v]] }]. */
function perLabel(ix, series, nameOf = (l) => l || series) {
  const byLabel = ix.get(series);
  if (!byLabel) return [];
  return [...byLabel.entries()].sort(([a], [b]) => a.localeCompare(b))
    .map(([label, byTime]) => ({ name: nameOf(label), points: [...byTime.entries()].sort((a, b) => a[0] - b[0]) }));
}

/** A series summed over its labels, as one line. */
function total(ix, series, name) {
  const byLabel = ix.get(series);
  if (!byLabel) return null;
  const sum = new Map();
  for (const byTime of byLabel.values()) for (const [t, v] of byTime) sum.set(t, (sum.get(t) || 0) + v);
  return { name, points: [...sum.entries()].sort((a, b) => a[0] - b[0]) };
}

/** sum / count per time and label (a mean per interval), in milliseconds. */
function mean(ix, sumSeries, countSeries, nameOf) {
  const sums = ix.get(sumSeries);
  const counts = ix.get(countSeries);
  if (!sums || !counts) return [];
  const lines = [];
  for (const [label, byTime] of [...sums.entries()].sort(([a], [b]) => a.localeCompare(b))) {
    const n = counts.get(label) || new Map();
    const points = [...byTime.entries()].filter(([t]) => n.get(t) > 0)
      .map(([t, v]) => [t, (v / n.get(t)) * 1000]).sort((a, b) => a[0] - b[0]);
    if (points.length) lines.push({ name: nameOf(label), points });
  }
  return lines;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function chart({ title, note, lines, from, to, format = (v) => fmtNumber(v, 2), key }) {
  lines = lines.filter((l) => l && l.points.length);
  const body = h('div', { class: 'chart', dataset: { chart: key } });
  if (!lines.length) {
    body.append(h('p', { class: 'empty' }, 'No points in this window.'));
    return section(title, { class: 'card chart-card' }, note ? h('p', { class: 'muted' }, note) : null, body);
  }
  const max = niceMax(lines.reduce((m, l) => l.points.reduce((n, p) => Math.max(n, p[1]), m), 0));
  const x = (t) => M.left + ((t - from) / (to - from)) * (W - M.left - M.right);
  const y = (v) => H - M.bottom - (v / max) * (H - M.top - M.bottom);
  const grid = [0, 0.25, 0.5, 0.75, 1].map((f) => s('g', { class: 'gridline' },
    s('line', { x1: M.left, x2: W - M.right, y1: y(f * max), y2: y(f * max) }),
    s('text', { x: M.left - 6, y: y(f * max) + 4, 'text-anchor': 'end' }, format(f * max))));
  const ticks = [0, 1 / 3, 2 / 3, 1].map((f) => {
    const t = from + f * (to - from);
    return s('text', { x: x(t), y: H - 8, 'text-anchor': f === 0 ? 'start' : f === 1 ? 'end' : 'middle', class: 'axis' },
      fmtTime(new Date(t).toISOString()));
  });
  const drawn = lines.map((l, i) => s('g', {
    class: `series s${i % 8}`,
    dataset: { name: l.name, lastAt: l.points[l.points.length - 1][0], lastValue: l.points[l.points.length - 1][1] },
  },
    s('polyline', { points: l.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(' ') }),
    l.points.length <= 60 ? l.points.map(([t, v]) => s('circle', { cx: x(t).toFixed(1), cy: y(v).toFixed(1), r: 2.5 },
      s('title', {}, `${l.name} at ${fmtTime(new Date(t).toISOString())}: ${format(v)}`))) : null));
  const summary = lines.map((l) => {
    const values = l.points.map((p) => p[1]);
    return { name: l.name, last: values[values.length - 1], max: values.reduce((a, b) => Math.max(a, b), -Infinity), sum: values.reduce((a, b) => a + b, 0) };
  });
  body.append(
    s('svg', {
      viewBox: `0 0 ${W} ${H}`, role: 'img',
      'aria-label': `${title}: ${summary.map((m) => `${m.name} last ${format(m.last)}, max ${format(m.max)}`).join('; ')}`,
    }, grid, ticks, drawn),
    h('ul', { class: 'legend' }, lines.map((l, i) => h('li', {}, h('span', { class: `swatch s${i % 8}`, 'aria-hidden': 'true' }), l.name))),
    h('details', {}, h('summary', {}, 'Figures'),
      h('table', { class: 'small' },
        h('thead', {}, h('tr', {}, ['Series', 'Last', 'Max', 'Sum'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, summary.map((m) => h('tr', {}, h('td', {}, m.name), h('td', { class: 'num' }, format(m.last)),
          h('td', { class: 'num' }, format(m.max)), h('td', { class: 'num' }, format(m.sum))))))));
  return section(title, { class: 'card chart-card' }, note ? h('p', { class: 'muted' }, note) : null, body);
}

export function charts(ctx) {
  const chosen = WINDOWS.find(([k]) => k === ctx.params.get('window')) || WINDOWS[0];
  const select = h('select', { id: 'f-window', name: 'window', on: { change: (e) => ctx.setParams({ window: e.target.value }) } },
    WINDOWS.map(([k]) => h('option', { value: k, selected: k === chosen[0] }, k === 'auto' ? 'since the first point' : `last ${k}`)));
  const grid = h('div', { class: 'grid charts' });
  ctx.root.append(
    h('div', { class: 'filters' }, h('label', { class: 'field' }, h('span', {}, 'Window'), select),
      h('p', { class: 'muted' }, 'One point per rollup interval ([metrics] rollup_interval, 60 s by default), summed over the nodes by the metrics_aggregator leader.')),
    grid);
  return {
    async update() {
      const data = await api(`api/dashboard/series${query({ minutes: chosen[1] || 1440 })}`);
      const ix = index(data.points);
      const to = new Date(data.now).getTime();
      let from = new Date(data.since).getTime();
      if (!chosen[1]) {
        const oldest = data.points.reduce((m, p) => Math.min(m, new Date(p.at).getTime()), to);
        from = Math.max(from, Math.min(oldest - (to - oldest) * 0.03, to - 5 * 60000));
      }
      const ms = (v) => fmtDuration(v);
      replace(grid,
        chart({ key: 'throughput', title: 'Job throughput', note: 'jobs completed per interval, by queue', from, to,
          lines: perLabel(ix, 'jobs_completed') }),
        chart({ key: 'failures', title: 'Failures', note: 'per interval, all queues and crons', from, to,
          lines: [total(ix, 'jobs_failed', 'jobs failed (retried later)'), total(ix, 'jobs_dead', 'jobs dead-lettered'),
            total(ix, 'jobs_cancelled', 'jobs cancelled'), total(ix, 'cron_failures', 'cron runs failed')] }),
        chart({ key: 'job-duration', title: 'Job duration', note: 'mean attempt duration per interval, by queue', from, to, format: ms,
          lines: mean(ix, 'job_duration_seconds_sum', 'job_attempts', (l) => l || 'all') }),
        chart({ key: 'cron-runs', title: 'Cron runs', note: 'runs per interval, by role', from, to,
          lines: perLabel(ix, 'cron_runs') }),
        chart({ key: 'cron-timing', title: 'Cron duration and lag', note: 'mean per interval, by role', from, to, format: ms,
          lines: [...mean(ix, 'cron_duration_seconds_sum', 'cron_runs', (l) => `${l} duration`),
            ...mean(ix, 'cron_lag_seconds_sum', 'cron_runs', (l) => `${l} lag`)] }),
        chart({ key: 'queue-depth', title: 'Queue depth', note: 'jobs waiting (sampled), by queue', from, to,
          lines: perLabel(ix, 'queue_depth') }),
        chart({ key: 'oldest-job', title: 'Oldest waiting job', note: 'age of the oldest available job (sampled), by queue', from, to,
          format: (v) => fmtDuration(v * 1000), lines: perLabel(ix, 'oldest_job_age_seconds') }));
    },
  };
}
