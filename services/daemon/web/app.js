// The dashboard shell: asks for the API key when the daemon wants one, routes by the URL hash, keeps one /ws
// connection and hands its job updates to the view on screen.
import { api, apiKey, onAuthNeeded, updates } from './api.js';
import { h, $, say } from './dom.js';
import { JobsList, JobPage, submitForm } from './jobs.js';
import { workersView, schedulesView, webhooksView } from './admin.js';
import { vmsView, vmView } from './vms.js';
import { Wizard } from './wizard.js';
import { PlansList, PlanPage } from './plans.js';

const main = $('#main');
let view = null;
let poll = null;
let stopUpdates = null;
/** The key's name and the roles it reaches (GET /whoami): pages disable what it may not do. */
let me = { roles: [] };

function showKeyForm(code) {
  stopUpdates?.();
  stopUpdates = null;
  const dlg = $('#auth');
  const msg = $('#auth-msg');
  if (code === 403 && apiKey.get()) say(msg, 'That API key is not accepted.', false);
  else say(msg, 'This daemon needs an API key.', true);
  apiKey.clear();
  dlg.hidden = false;
  $('#auth-key').focus();
}
onAuthNeeded(showKeyForm);

$('#auth-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  apiKey.set($('#auth-key').value.trim());
  $('#auth-key').value = '';
  $('#auth').hidden = true;
  await start();
});

function setStatus(s) {
  $('#counts').replaceChildren(
    ...[['pending', s.pending_jobs], ['running', s.running_jobs], ['completed', s.completed_jobs], ['failed', s.failed_jobs], ['cancelled', s.cancelled_jobs]]
      .filter(([, n]) => n !== undefined).map(([k, n]) => h('a', { href: `#/jobs?status=${k}`, class: `count ${k}` }, h('b', {}, n), ` ${k}`)),
    h('span', { class: 'count' }, h('b', {}, s.active_workers ?? ''), ' workers'),
  );
}

function onUpdate(m) {
  if (m.type === 'status') setStatus(m.data);
  else if (m.type === 'job_update') view?.update?.(m.data);
  else if (m.type === 'plan_update') view?.plan?.(m.data);
  else if (m.type === 'schedule_event' && location.hash.startsWith('#/schedules')) schedulesView.refresh?.(); // keeps the message line
}

async function route() {
  view?.destroy?.();
  view = null;
  clearInterval(poll);
  const [path, qs] = (location.hash.slice(1) || '/jobs').split('?');
  const params = new URLSearchParams(qs || '');
  const section = { '/job/': '#/jobs', '/vm': '#/vms', '/plan/': '#/plans' };
  for (const a of document.querySelectorAll('nav a')) {
    const href = a.getAttribute('href');
    a.classList.toggle('active', path === href.slice(1) || Object.entries(section).some(([p, nav]) => path.startsWith(p) && nav === href));
  }
  // Each visit renders into a fresh element: a slow answer meant for the previous view lands in a detached
  // element instead of over the current one.
  const el = h('div', { class: 'view' });
  main.replaceChildren(el);
  const guard = (f) => f().catch((e) => { if (e.status !== 401 && e.status !== 403) el.replaceChildren(h('p', { class: 'msg err' }, e.message)); });
  if (path.startsWith('/job/')) view = new JobPage(el, decodeURIComponent(path.slice(5)));
  else if (path === '/submit') submitForm(el);
  else if (path === '/workers') { await guard(() => workersView(el)); poll = setInterval(() => el.isConnected && guard(() => workersView(el)), 5000); }
  else if (path === '/schedules') await guard(() => schedulesView(el));
  else if (path === '/webhooks') await guard(() => webhooksView(el));
  else if (path === '/vms') await guard(() => vmsView(el, params));
  else if (path === '/vm') await guard(() => vmView(el, params));
  else if (path === '/migrate') { const w = new Wizard(el, me); await guard(() => w.load(params)); }
  else if (path === '/plans') { const l = new PlansList(el); view = l; await guard(() => l.load()); }
  else if (path.startsWith('/plan/')) { const pg = new PlanPage(el, decodeURIComponent(path.slice(6)), me); view = pg; await guard(() => pg.load()); }
  else view = new JobsList(el, params);
}

async function start() {
  try {
    setStatus(await api('GET', '/status'));
    me = await api('GET', '/whoami');
  } catch (e) { if (e.status === 401 || e.status === 403) return; }
  stopUpdates?.();
  stopUpdates = updates(onUpdate, (up) => { $('#live').textContent = up ? '● live' : '○ reconnecting'; $('#live').className = up ? 'live' : 'live off'; });
  await route();
}

window.addEventListener('hashchange', () => { if ($('#auth').hidden) void route(); });
void start();
