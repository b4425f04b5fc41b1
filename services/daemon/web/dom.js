// Small DOM and formatting helpers (no framework: the page is a handful of tables and forms).
export function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    // Through the CSSOM: the Content-Security-Policy (no inline styles) refuses a style attribute, not this.
    else if (k === 'style') el.style.cssText = v;
    else if (k in el && typeof v !== 'string') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of kids.flat(Infinity)) if (c !== undefined && c !== null && c !== false) el.append(c instanceof Node ? c : String(c));
  return el;
}

export const $ = (sel, root = document) => root.querySelector(sel);

export function bytes(n) {
  if (n === null || n === undefined) return '';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

export function duration(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return '';
  s = Math.round(s);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

export function ago(iso) {
  if (!iso) return '';
  const s = (Date.now() - Date.parse(iso)) / 1000;
  return s < 1 ? 'just now' : `${duration(s)} ago`;
}

export const time = (iso) => (iso ? new Date(iso).toLocaleString() : '');

export function progressBar(pct, status) {
  const p = Math.max(0, Math.min(100, Number(pct) || 0));
  return h('div', { class: `bar ${status || ''}`, role: 'progressbar', 'aria-valuenow': String(p), 'aria-valuemin': '0', 'aria-valuemax': '100' },
    h('div', { class: 'fill', style: `width:${p}%` }), h('span', {}, `${p.toFixed(p % 1 ? 1 : 0)} %`));
}

export const badge = (status) => h('span', { class: `badge ${status}` }, status);

export function rateText(p) {
  if (!p) return '';
  if (p.rate_bytes_per_second) return `${bytes(p.rate_bytes_per_second)}/s`;
  if (p.rate_percent_per_second) return `${p.rate_percent_per_second.toFixed(1)} %/s`;
  return '';
}

/** A message line under a form: ok (green) or error (red). */
export function say(el, text, ok = true) { el.textContent = text; el.className = `msg ${ok ? 'ok' : 'err'}`; }
