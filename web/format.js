// The page's formatting helpers: each takes anything and returns a string, DASH when the value
// is unusable, so a missing or malformed field renders as "—" and never throws. Loaded before
// charts.js and app.js, which share these names (classic scripts share one global scope).
'use strict';

const DASH = '—';
// ---------------------------------------------------------------------------------------------
// Formatting: each helper takes anything and returns a string, DASH when the value is unusable.

function isNum(v) {
  return typeof v === 'number' && Number.isFinite(v);
}

function fixed(v, digits) {
  return isNum(v) ? v.toFixed(digits) : DASH;
}

function integer(v) {
  return isNum(v) ? Math.round(v).toLocaleString('en-US') : DASH;
}

// 1234 -> "1.23k", 12345678 -> "12.3M": three significant digits keep columns short.
function compact(v) {
  if (!isNum(v)) return DASH;
  const units = ['', 'k', 'M', 'G', 'T', 'P'];
  let i = 0;
  let x = Math.abs(v);
  while (x >= 1000 && i < units.length - 1) {
    x /= 1000;
    i += 1;
  }
  const digits = x >= 100 || i === 0 && Number.isInteger(x) ? 0 : x >= 10 ? 1 : 2;
  return (v < 0 ? '-' : '') + x.toFixed(digits) + units[i];
}

function bytes(v) {
  if (!isNum(v)) return DASH;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let x = Math.abs(v);
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i += 1;
  }
  return x.toFixed(i === 0 ? 0 : x >= 100 ? 0 : x >= 10 ? 1 : 2) + ' ' + units[i];
}

function learningRate(v) {
  return isNum(v) ? v.toExponential(2) : DASH;
}

function percent(v) {
  return isNum(v) ? (v * 100).toFixed(v < 0.1 ? 1 : 0) + '%' : DASH;
}

// Seconds -> "42 s", "3 min 05 s", "2 h 10 min", "1 d 4 h".
function duration(seconds) {
  if (!isNum(seconds) || seconds < 0) return DASH;
  const s = Math.round(seconds);
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + String(s % 60).padStart(2, '0') + ' s';
  if (s < 86400) return Math.floor(s / 3600) + ' h ' + String(Math.floor(s % 3600 / 60)).padStart(2, '0') + ' min';
  return Math.floor(s / 86400) + ' d ' + Math.floor(s % 86400 / 3600) + ' h';
}

function ago(seconds) {
  if (!isNum(seconds)) return DASH;
  return seconds < 1 ? 'now' : duration(seconds) + ' ago';
}

// The API's times may be Unix seconds, Unix milliseconds or ISO 8601 strings.
function parseTime(at) {
  if (isNum(at)) return new Date(at > 1e12 ? at : at * 1000);
  if (typeof at === 'string' && at !== '') {
    const ms = Date.parse(at);
    return Number.isNaN(ms) ? null : new Date(ms);
  }
  return null;
}

function clock(date) {
  return date ? date.toLocaleTimeString('en-GB', { hour12: false }) : DASH;
}

function text(v) {
  return v === undefined || v === null || v === '' ? DASH : String(v);
}

