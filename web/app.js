// The coordinator's live page: polls the JSON API (/api/run, /api/peers, /api/history) every
// 2 s and renders the run's progress, charts, peers and events. Plain DOM and uPlot, no build
// step. Every field may be missing (an empty run, an older coordinator), so every read goes
// through the format helpers, which render "—" instead of throwing.
'use strict';

const POLL_MS = 2000;
const FETCH_TIMEOUT_MS = 5000;
const MAX_EVENTS = 200;
const MAX_HISTORY_PAGES = 50;  // a long run's history arrives in pages ("more": true)
const ETA_WINDOW = 20;  // steps whose pace predicts the rest

// What the page knows between polls. Steps are kept by step number so that re-fetched or
// corrected rows replace older ones instead of duplicating them.
const state = {
  runId: undefined,
  steps: new Map(),    // step -> history row
  lastStep: null,      // highest step fetched, the next `since`
  events: new Map(),   // seq (or text+time) -> event
  lastEventSeq: null,  // highest event seq fetched, the next `events_since`
  charts: {},          // name -> uPlot instance
  uptime: undefined,   // the coordinator's uptime at the last poll
  restarts: undefined, // the run's restarts from a checkpoint at the last poll
  failingSince: null,  // Date of the first failed poll in a row
  loaded: false,
};

// ---------------------------------------------------------------------------------------------
// DOM helpers. Peer-supplied strings (agent, drop reasons, event texts) only ever go into
// textContent, never innerHTML: a peer must not be able to inject markup into this page.

function byId(id) {
  return document.getElementById(id);
}

function setText(id, value) {
  const node = byId(id);
  if (node) node.textContent = value;
}

function element(tag, className, content) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (content !== undefined) node.textContent = content;
  return node;
}

// A colour family for a state or phase name, so unknown names still render (as neutral).
function tone(name) {
  const n = String(name || '').toLowerCase();
  if (/^(active|training|running|ok|accepted)$/.test(n)) return 'good';
  if (/^(syncing|joining|waiting|waiting_for_peers|warmup|starting|fetching|restarting|paused)$/.test(n)) return 'wait';
  if (/^(dropped|failed|error|rejected|stalled)$/.test(n)) return 'bad';
  if (/^(finished|done|complete|completed)$/.test(n)) return 'done';
  return 'idle';
}

// ---------------------------------------------------------------------------------------------
// Fetching.

async function getJSON(path) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), FETCH_TIMEOUT_MS);
  try {
    const response = await fetch(path, { cache: 'no-store', signal: controller.signal });
    if (!response.ok) throw new Error(path + ': HTTP ' + response.status);
    return await response.json();
  } finally {
    clearTimeout(timer);
  }
}

// The first poll (and one after a reset) fetches the whole history; later ones only the steps
// and events after those already kept.
function historyPath(since, eventsSince) {
  const query = [];
  if (since !== null) query.push('since=' + since);
  if (eventsSince !== null) query.push('events_since=' + eventsSince);
  return 'api/history' + (query.length ? '?' + query.join('&') : '');
}

function highest(items, field, start) {
  let top = start;
  for (const item of Array.isArray(items) ? items : []) {
    if (item && isNum(item[field]) && (top === null || item[field] > top)) top = item[field];
  }
  return top;
}

// The coordinator answers at most so many steps at a time and says "more": true; ask again from
// the last step received until it has sent them all (bounded, so a bad answer cannot loop).
async function fetchHistory() {
  const pages = [];
  let since = state.lastStep;
  let eventsSince = state.lastEventSeq;
  for (let i = 0; i < MAX_HISTORY_PAGES; i++) {
    const page = await getJSON(historyPath(since, eventsSince));
    pages.push(page);
    const next = highest(page && page.steps, 'step', since);
    if (!page || page.more !== true || next === since) break;
    since = next;
    eventsSince = highest(page.events, 'seq', eventsSince);
  }
  return pages;
}

// A different run, a run that went back in steps (a restart from a checkpoint), or a new
// coordinator process (its uptime went down; its event numbers may start over) makes the kept
// history wrong: forget it and fetch it whole on this poll.
function resetIfRewound(run) {
  const runId = run ? run.run_id : undefined;
  const step = run ? run.step : undefined;
  const uptime = run ? run.uptime_seconds : undefined;
  // `step` counts finalized steps and lastStep is a row index: rows at or past `step` were undone.
  // A restart from a checkpoint can also re-finalize past lastStep between two polls, so a new
  // restart count rewinds too.
  const rewound = isNum(step) && state.lastStep !== null && step <= state.lastStep;
  const restarts = run && run.counters ? run.counters.restarts : undefined;
  const restartedRun = isNum(restarts) && isNum(state.restarts) && restarts !== state.restarts;
  const restarted = isNum(uptime) && isNum(state.uptime) && uptime < state.uptime - 1;
  state.uptime = uptime;
  state.restarts = restarts;
  if (runId !== state.runId || rewound || restartedRun || restarted) {
    state.runId = runId;
    state.steps.clear();
    state.events.clear();
    state.lastStep = null;
    state.lastEventSeq = null;
  }
}

function ingestHistory(history) {
  const steps = history && Array.isArray(history.steps) ? history.steps : [];
  for (const row of steps) {
    if (!row || !isNum(row.step)) continue;
    state.steps.set(row.step, row);
    if (state.lastStep === null || row.step > state.lastStep) state.lastStep = row.step;
  }
  const events = history && Array.isArray(history.events) ? history.events : [];
  for (const event of events) {
    if (!event) continue;
    const key = isNum(event.seq) ? 'seq:' + event.seq : 'at:' + event.at + ':' + event.text;
    state.events.set(key, event);
  }
  state.lastEventSeq = highest(events, 'seq', state.lastEventSeq);
  trimEvents();
}

function sortedEvents() {
  const time = (e) => { const d = parseTime(e.at); return d ? d.getTime() : 0; };
  return Array.from(state.events.values()).sort((a, b) =>
    isNum(a.seq) && isNum(b.seq) ? b.seq - a.seq : time(b) - time(a));
}

function trimEvents() {
  if (state.events.size <= MAX_EVENTS) return;
  const keep = new Set(sortedEvents().slice(0, MAX_EVENTS));
  for (const [key, event] of state.events) {
    if (!keep.has(event)) state.events.delete(key);
  }
}

function sortedSteps() {
  return Array.from(state.steps.values()).sort((a, b) => a.step - b.step);
}

// ---------------------------------------------------------------------------------------------
// Rendering: one function per part of the page.

function renderHeader(run) {
  setText('run-id', text(run.run_id));
  const phase = byId('phase');
  phase.textContent = text(run.phase);
  phase.dataset.tone = tone(run.phase);
  const model = run.model || {};
  const params = isNum(model.parameters) ? ' · ' + compact(model.parameters) + ' params' : '';
  setText('model', text(model.preset) + params);
  setText('optimizer', text(model.optimizer));
  setText('batch', isNum(model.batch_size) || isNum(model.seq_len)
    ? text(model.batch_size) + ' × ' + text(model.seq_len) + ' tokens' : DASH);
  setText('uptime', duration(run.uptime_seconds));
  const started = parseTime(run.started_at);
  byId('uptime').title = started ? 'started ' + started.toLocaleString() : '';
  document.title = 'agora · ' + (isNum(run.step) ? 'step ' + run.step + ' · ' : '') + text(run.phase);
}

// Seconds per step over the last ETA_WINDOW steps: from their timestamps when present (that
// includes time between rounds), otherwise from the rounds' own durations.
function secondsPerStep(rows) {
  const recent = rows.slice(-ETA_WINDOW);
  if (recent.length >= 2) {
    const first = parseTime(recent[0].at);
    const last = parseTime(recent[recent.length - 1].at);
    const span = recent[recent.length - 1].step - recent[0].step;
    if (first && last && span > 0 && last > first) return (last - first) / 1000 / span;
  }
  const durations = recent.map((r) => r.seconds).filter(isNum);
  if (durations.length === 0) return null;
  return durations.reduce((a, b) => a + b, 0) / durations.length;
}

function renderProgress(run, rows) {
  const step = run.step;
  const total = run.total_steps;
  setText('step', integer(step));
  setText('total-steps', integer(total));
  const fraction = isNum(step) && isNum(total) && total > 0 ? Math.min(1, Math.max(0, step / total)) : null;
  setText('percent', fraction === null ? DASH : (fraction * 100).toFixed(1) + '%');
  byId('progress-fill').style.width = fraction === null ? '0' : (fraction * 100).toFixed(2) + '%';
  byId('progress').setAttribute('aria-valuenow', fraction === null ? '0' : (fraction * 100).toFixed(0));

  let eta = 'ETA ' + DASH;
  if (tone(run.phase) === 'done' || fraction === 1) {
    eta = 'finished';
  } else if (isNum(step) && isNum(total)) {
    const pace = secondsPerStep(rows);
    if (isNum(pace)) eta = 'ETA ' + duration(pace * (total - step)) + ' at ' + fixed(pace, 2) + ' s / step';
  }
  setText('eta', eta);
}

function renderStats(run) {
  setText('loss', fixed(run.loss, 4));
  setText('val-loss', fixed(run.val_loss, 4));
  setText('tokens-per-second', compact(run.tokens_per_second));
  setText('learning-rate', learningRate(run.learning_rate));

  const peers = run.peers || {};
  setText('peers-active', integer(peers.active));
  setText('peers-other', 'syncing ' + integer(peers.syncing) + ' · left ' + integer(peers.left) +
    ' · dropped ' + integer(peers.dropped));

  renderBytes(run.payload_bytes_per_step, run.allreduce_bytes_per_step);
}

// Payload bytes against the all-reduce's, drawn to the same linear scale on purpose: that the
// payload bar is a sliver is the point of DeMo.
function renderBytes(payload, allreduce) {
  setText('payload-bytes', bytes(payload));
  setText('allreduce-bytes', bytes(allreduce));
  const both = isNum(payload) && isNum(allreduce) && payload > 0 && allreduce > 0;
  setText('ratio', both ? '×' + compact(allreduce / payload) + ' less' : DASH);
  const largest = both ? Math.max(payload, allreduce) : 0;
  const width = (v) => (largest > 0 && isNum(v) ? Math.max(0.5, 100 * v / largest).toFixed(2) + '%' : '0');
  byId('payload-bar').style.width = width(payload);
  byId('allreduce-bar').style.width = width(allreduce);
}

function renderCounters(counters) {
  const list = byId('counters');
  list.replaceChildren();
  const entries = counters && typeof counters === 'object' ? Object.entries(counters) : [];
  if (entries.length === 0) {
    list.append(pair(DASH, ''));
    return;
  }
  for (const [name, value] of entries) {
    list.append(pair(name.replace(/_/g, ' '), isNum(value) ? integer(value) : text(value)));
  }
}

function pair(term, definition) {
  const div = element('div');
  div.append(element('dt', '', term), element('dd', '', definition));
  return div;
}

// Active peers first, then by short key, so rows do not jump between polls.
function peerOrder(a, b) {
  const rank = (p) => ({ active: 0, syncing: 1, left: 2, dropped: 3 }[p.state] ?? 4);
  return rank(a) - rank(b) || String(a.short || a.key).localeCompare(String(b.short || b.key));
}

function renderPeers(peers) {
  const list = Array.isArray(peers) ? peers.filter(Boolean).slice().sort(peerOrder) : [];
  const body = byId('peers-body');
  body.replaceChildren();
  setText('peer-count', list.length ? String(list.length) : '');
  if (list.length === 0) {
    const row = element('tr', 'empty');
    const cell = element('td', '', 'no peers yet');
    cell.colSpan = 10;
    row.append(cell);
    body.append(row);
    return;
  }
  for (const peer of list) body.append(peerRow(peer));
}

function peerRow(peer) {
  const row = element('tr');
  row.dataset.state = text(peer.state);

  const key = element('td', 'key', text(peer.short || (peer.key && String(peer.key).slice(0, 8))));
  key.title = [peer.key, peer.endpoint].filter(Boolean).join('\n');
  if (peer.checkpointer) key.append(element('span', 'tag', 'ckpt'));

  const stateCell = element('td');
  const badge = element('span', 'badge', text(peer.state));
  badge.dataset.tone = tone(peer.state);
  stateCell.append(badge);
  if (peer.drop_reason) stateCell.append(element('div', 'reason', String(peer.drop_reason)));

  const share = element('td', 'share');
  const shareBar = element('span', 'share-bar');
  const shareFill = element('span', 'share-fill');
  shareFill.style.width = isNum(peer.share) ? Math.min(100, Math.max(0, peer.share * 100)).toFixed(1) + '%' : '0';
  shareBar.append(shareFill);
  share.append(shareBar, element('span', 'share-value', percent(peer.share)));

  const strikes = element('td', 'num', integer(peer.strikes));
  if (isNum(peer.strikes) && peer.strikes > 0) strikes.classList.add('warn');
  const seen = element('td', 'num', ago(peer.last_seen_seconds_ago));
  if (isNum(peer.last_seen_seconds_ago) && peer.last_seen_seconds_ago > 10 && peer.state === 'active') {
    seen.classList.add('warn');
  }

  row.append(
    key, stateCell,
    element('td', 'num', fixed(peer.sequences_per_second, 1)),
    share, strikes, seen,
    element('td', 'num', integer(peer.applied_steps)),
    element('td', 'num', bytes(peer.payload_bytes)),
    element('td', 'num', integer(peer.commits)),
    element('td', 'agent', text(peer.agent)));
  return row;
}

function renderEvents() {
  const list = byId('events');
  list.replaceChildren();
  // Round lines come one per step and the charts already show them; the list keeps what stands
  // out (joins, drops, checkpoints, rejections, ...).
  const events = sortedEvents().filter((event) => event.kind !== 'round');
  if (events.length === 0) {
    list.append(element('li', 'empty', 'no events yet'));
    return;
  }
  for (const event of events) {
    const item = element('li');
    const kind = text(event.kind || 'other');
    item.dataset.kind = kind;
    const when = parseTime(event.at);
    const time = element('time', 'when', clock(when));
    if (when) time.dateTime = when.toISOString();
    item.append(time, element('span', 'kind', kind), element('span', 'what', text(event.text)));
    list.append(item);
  }
}

// ---------------------------------------------------------------------------------------------
// Connection state: a banner while the coordinator cannot be reached; the last data received
// stays on the page, dimmed.

function showUnreachable(error) {
  if (!state.failingSince) state.failingSince = new Date();
  const banner = byId('banner');
  banner.textContent = 'The coordinator cannot be reached (' + (error && error.message ? error.message : error) +
    ') since ' + clock(state.failingSince) + '. Retrying every ' + POLL_MS / 1000 + ' s' +
    (state.loaded ? '; the figures below are from before.' : '.');
  banner.hidden = false;
  document.body.classList.add('stale');
}

function showReachable() {
  state.failingSince = null;
  byId('banner').hidden = true;
  document.body.classList.remove('stale');
  setText('updated', 'updated ' + clock(new Date()));
}

// ---------------------------------------------------------------------------------------------
// The poll loop. Fetch failures show the banner; a failure while rendering is a bug in this
// page, so it goes to console.error (counted by errors.js) instead of being mistaken for a
// lost connection.

async function fetchAll() {
  const [run, peers] = await Promise.all([getJSON('api/run'), getJSON('api/peers')]);
  resetIfRewound(run);
  const history = await fetchHistory();
  return { run: run || {}, peers, history };
}

function render(snapshot) {
  for (const page of snapshot.history) ingestHistory(page);
  const rows = sortedSteps();
  renderHeader(snapshot.run);
  renderProgress(snapshot.run, rows);
  renderStats(snapshot.run);
  renderCounters(snapshot.run.counters);
  renderPeers(snapshot.peers);
  renderEvents();
  renderCharts(rows);
}

async function poll() {
  let snapshot = null;
  try {
    snapshot = await fetchAll();
  } catch (error) {
    showUnreachable(error);
  }
  if (snapshot) {
    try {
      render(snapshot);
      showReachable();
      if (!state.loaded) {
        state.loaded = true;
        document.body.dataset.loaded = '1';
      }
    } catch (error) {
      console.error('rendering failed:', error);
    }
  }
  setTimeout(poll, POLL_MS);
}

watchChartSizes();
watchColorScheme();
poll();
