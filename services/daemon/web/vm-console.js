// The VM console: xterm.js (served locally) over the daemon's /virt/console WebSocket, which bridges to the
// domain's serial console. Keys typed go to the guest; everything the guest prints is shown.
import { api, apiKey } from './api.js';
import { $, h } from './dom.js';

const ROOT = location.pathname.replace(/\/web\/dashboard(\/.*)?$/, '');
const status = (text, err = false) => { const s = $('#status'); s.textContent = text; s.className = `msg${err ? ' err' : ''}`; };
const term = new window.Terminal({ convertEol: false, cursorBlink: true, rows: 30, cols: 100, fontSize: 14 });
term.open($('#terminal'));
let ws;

async function loadDomains() {
  try {
    const r = await api('GET', '/virt/domains');
    const sel = $('#domain');
    sel.replaceChildren(...r.data.domains.map((d) => h('option', { value: d.name }, `${d.name} (${d.state})`)));
    const want = new URLSearchParams(location.search).get('name');
    if (want) sel.value = want;
    if (!r.data.domains.length) status('No domains are defined on the virtualization host.');
  } catch (e) {
    status(e.status === 401 || e.status === 403 ? 'An API key is needed: enter it on the dashboard first.' : `Cannot list domains: ${e.message}`, true);
  }
}

async function connect(name) {
  if (ws) ws.close();
  term.reset();
  const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
  // A key never goes into a URL: with one, the WebSocket opens with a single-use ticket (POST /ws/ticket).
  const q = new URLSearchParams({ name });
  if (apiKey.get()) {
    try { q.set('ticket', (await api('POST', '/ws/ticket')).ticket); } catch (e) { status(`Cannot get a console ticket: ${e.message}`, true); return; }
  }
  ws = new WebSocket(`${proto}//${location.host}${ROOT}/virt/console?${q}`);
  status(`Connecting to ${name}…`);
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.type === 'data') term.write(m.data);
    else if (m.type === 'status') { status(`Connected to ${m.domain} (${m.state}). ${m.mode === 'read' ? 'Read-only: typing needs an admin key and no other writer.' : 'Type into the terminal.'}`); term.focus(); }
    else if (m.type === 'error') status(m.error, true);
    else if (m.type === 'closed') status(`The console of ${name} ended${m.error ? `: ${m.error}` : ''}.`, !!m.error);
  };
  ws.onclose = () => { $('#disconnect').disabled = true; };
  ws.onopen = () => { $('#disconnect').disabled = false; };
}

term.onData((data) => { if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'input', data })); });
$('#pick').addEventListener('submit', (e) => { e.preventDefault(); if ($('#domain').value) connect($('#domain').value); });
$('#disconnect').addEventListener('click', () => ws?.close());
await loadDomains();
if (new URLSearchParams(location.search).get('name')) await connect($('#domain').value);
