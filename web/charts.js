// The page's charts (uPlot): built from the history rows app.js keeps, rebuilt when the colour
// scheme or the container's size changes. Loaded after format.js and before app.js.
'use strict';

// Tick spacings for the step axis: whole steps only.
const STEP_INCREMENTS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000,
  10000, 20000, 25000, 50000, 100000, 200000, 500000, 1000000];

// ---------------------------------------------------------------------------------------------
// Charts (uPlot). Colours come from the stylesheet's custom properties, so they follow the
// light or dark scheme; a change of scheme rebuilds the charts.

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function axisOptions(format, size, splits) {
  const axis = {
    size: size || 50,
    stroke: cssVar('--muted'),
    grid: { stroke: cssVar('--grid'), width: 1 },
    ticks: { stroke: cssVar('--grid'), width: 1 },
    font: '11px ' + cssVar('--font-mono'),
  };
  if (format) axis.values = (u, values) => values.map(format);
  if (splits) {
    axis.splits = splits;
    axis.filter = (u, values) => values;  // label every split (log axes otherwise label decades only)
  }
  return axis;
}

// Ticks for the log-scale bytes axis: powers of two (every second, third, ... one when the range
// is wide), so the labels read 4 KiB, 64 KiB, 1 MiB rather than uPlot's uneven defaults.
function powerOfTwoSplits(u, axisIndex, min, max) {
  if (!isNum(min) || !isNum(max) || min <= 0 || max <= min) return [];
  const low = Math.ceil(Math.log2(min));
  const high = Math.floor(Math.log2(max));
  const every = Math.max(1, Math.ceil((high - low + 1) / 6));
  const splits = [];
  for (let e = low; e <= high; e += every) splits.push(2 ** e);
  return splits;
}

// The bytes chart's range: from a power of two below the data to one above it, with some room,
// so neither line lies on the chart's edge and the ticks fall on round sizes. With no data
// (uPlot passes null) it shows 1 KiB to 1 MiB instead of an invalid range.
function bytesRange(u, min, max) {
  if (!isNum(min) || !isNum(max) || min <= 0 || max <= 0) return [1024, 1024 * 1024];
  return [2 ** Math.floor(Math.log2(min / 1.5)), 2 ** Math.ceil(Math.log2(max * 1.5))];
}

function chartSpecs() {
  const stepSeries = { label: 'step', value: (u, v) => integer(v) };
  return {
    loss: {
      node: 'chart-loss',
      series: [stepSeries,
        { label: 'loss', stroke: cssVar('--c-loss'), width: 2, value: (u, v) => fixed(v, 4) },
        { label: 'validation', stroke: cssVar('--c-val'), width: 2, spanGaps: true,
          points: { show: true, size: 6 }, value: (u, v) => fixed(v, 4) }],
      scales: { x: { time: false } },
      format: (v) => fixed(v, 2),
      axisSize: 50,
    },
    throughput: {
      node: 'chart-throughput',
      series: [stepSeries,
        { label: 'tokens / s', stroke: cssVar('--c-tps'), fill: cssVar('--c-tps-fill'), width: 2,
          value: (u, v) => compact(v) }],
      scales: { x: { time: false } },
      format: compact,
      axisSize: 56,
    },
    bytes: {
      node: 'chart-bytes',
      series: [stepSeries,
        { label: 'payloads', stroke: cssVar('--c-payload'), width: 2, value: (u, v) => bytes(v) },
        { label: 'all-reduce', stroke: cssVar('--c-allreduce'), width: 2, dash: [6, 4],
          value: (u, v) => bytes(v) }],
      scales: { x: { time: false }, y: { distr: 3, log: 2, range: bytesRange } },
      height: 220,
      format: (v) => bytes(v).replace(/\.0+ /, ' '),  // "64 MiB", not "64.0 MiB"
      axisSize: 76,
      splits: powerOfTwoSplits,
    },
  };
}

// Column arrays for each chart, from the kept history. A log scale cannot show zero, so the
// byte series turn non-positive values into gaps.
function chartData(rows) {
  const col = (field, positive) => rows.map((r) =>
    isNum(r[field]) && (!positive || r[field] > 0) ? r[field] : null);
  const steps = rows.map((r) => r.step);
  return {
    loss: [steps, col('loss'), col('val_loss')],
    throughput: [steps, col('tokens_per_second')],
    bytes: [steps, col('payload_bytes', true), col('allreduce_bytes', true)],
  };
}

function chartSize(container, height) {
  const width = Math.max(200, Math.floor(container.clientWidth));
  return { width, height: height || Math.round(Math.min(280, Math.max(180, width * 0.42))) };
}

function destroyCharts() {
  for (const chart of Object.values(state.charts)) chart.destroy();
  state.charts = {};
}

function buildCharts(data) {
  const specs = chartSpecs();
  for (const [name, spec] of Object.entries(specs)) {
    const container = byId(spec.node);
    container.replaceChildren();
    const options = {
      ...chartSize(container, spec.height),
      series: spec.series,
      scales: spec.scales,
      axes: [{ ...axisOptions((v) => integer(v)), incrs: STEP_INCREMENTS }, axisOptions(spec.format, spec.axisSize, spec.splits)],
      legend: { live: true },
      // No drag-to-zoom: every poll resets the scales to show the new steps, which would undo it.
      cursor: { drag: { x: false, y: false } },
    };
    state.charts[name] = new uPlot(options, data[name], container);
  }
}

function renderCharts(rows) {
  const data = chartData(rows);
  const lossPoints = data.loss[1].filter(isNum).length;
  document.body.dataset.lossPoints = String(lossPoints);
  document.body.classList.toggle('no-steps', rows.length === 0);
  if (typeof uPlot === 'undefined') return;  // the vendor script failed; errors.js counted it
  if (Object.keys(state.charts).length === 0) {
    buildCharts(data);
    return;
  }
  for (const [name, chart] of Object.entries(state.charts)) chart.setData(data[name]);
}

function watchChartSizes() {
  if (typeof ResizeObserver === 'undefined') return;
  const observer = new ResizeObserver((entries) => {
    const specs = chartSpecs();
    for (const entry of entries) {
      const name = Object.keys(state.charts).find((n) => state.charts[n].root.parentNode === entry.target);
      if (!name) continue;
      const chart = state.charts[name];
      const size = chartSize(entry.target, specs[name].height);
      if (size.width !== chart.width) chart.setSize(size);
    }
  });
  for (const spec of Object.values(chartSpecs())) observer.observe(byId(spec.node));
}

function watchColorScheme() {
  const query = window.matchMedia ? window.matchMedia('(prefers-color-scheme: dark)') : null;
  if (!query || !query.addEventListener) return;
  query.addEventListener('change', () => {
    if (typeof uPlot === 'undefined') return;
    destroyCharts();
    renderCharts(sortedSteps());
  });
}

