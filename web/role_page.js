// The pages of the roles that serve members (swarm.html, async.html, rl.html): each polls its
// /api/<role> (serve/status_server.h) and renders tables from it. Every value is escaped: a
// worker's name or a verdict comes from the network.
'use strict';

const esc = (v) => String(v ?? '-').replace(/[&<>"']/g,
  (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'})[c]);

// A number with `digits` decimals, anything else escaped.
const num = (v, digits = 3) =>
  typeof v === 'number' && !Number.isInteger(v) ? v.toFixed(digits) : esc(v);

// A table of `rows` (objects) under `columns`: [[heading, key or function of the row], ...].
function table(columns, rows) {
  let h = '<table><tr>' + columns.map(([name]) => `<th>${esc(name)}</th>`).join('') + '</tr>';
  for (const row of rows || []) {
    h += '<tr>' + columns.map(([, key]) =>
      `<td>${typeof key === 'function' ? key(row) : num(row[key])}</td>`).join('') + '</tr>';
  }
  return h + '</table>';
}

// Fetches `api` every `ms` and hands its JSON to `render`; a failed fetch shows in #error.
function poll(api, render, ms = 1000) {
  const error = document.getElementById('error');
  const tick = async () => {
    try {
      const r = await fetch(api, {cache: 'no-store'});
      if (!r.ok) throw new Error(`${api}: HTTP ${r.status}`);
      render(await r.json());
      error.textContent = '';
    } catch (e) {
      error.textContent = `${e.message} (retrying)`;
    }
  };
  tick();
  setInterval(tick, ms);
}
