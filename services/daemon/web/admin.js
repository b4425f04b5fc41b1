// Workers and queues (read from the daemon's /workers and /queue), schedules (create, enable/disable, trigger,
// delete) and webhooks (add, delete, test, delivery log).
import { api } from './api.js';
import { h, ago, time, say } from './dom.js';

export async function workersView(el) {
  const [w, q] = await Promise.all([api('GET', '/workers'), api('GET', '/queue')]);
  el.replaceChildren(
    h('h2', {}, `Workers (${w.active} active of ${w.total})`),
    h('table', { class: 'workers' },
      h('thead', {}, h('tr', {}, ['Worker', 'Capabilities', 'Mode', 'Last heartbeat', 'Active', 'Jobs held'].map((t) => h('th', {}, t)))),
      h('tbody', {}, w.workers.length ? w.workers.map((x) => h('tr', { dataset: { id: x.worker_id } },
        h('td', {}, x.worker_id), h('td', {}, x.capabilities.map((c) => h('span', { class: 'cap' }, c))), h('td', {}, x.execution_mode),
        h('td', { title: time(x.last_heartbeat) }, ago(x.last_heartbeat)), h('td', {}, x.active ? '✔' : h('span', { class: 'err' }, 'stale')),
        h('td', {}, x.jobs.map((id) => h('a', { href: `#/job/${encodeURIComponent(id)}` }, id, ' ')))))
        : h('tr', {}, h('td', { colspan: 6, class: 'empty' }, 'no workers registered')))),
    h('h2', {}, `Queues (${q.total_jobs} queued)`),
    h('table', { class: 'queues' },
      h('thead', {}, h('tr', {}, ['Requirement set', 'Capabilities', 'Queued', 'Assigned', 'Running', 'Matching workers', 'Waiting because'].map((t) => h('th', {}, t)))),
      h('tbody', {}, q.queues.map((x) => h('tr', { dataset: { name: x.name } },
        h('td', {}, h('code', {}, x.name)), h('td', {}, x.capabilities.length ? x.capabilities.map((c) => h('span', { class: 'cap' }, c)) : h('i', {}, 'none')),
        h('td', {}, x.queued), h('td', {}, x.assigned), h('td', {}, x.running), h('td', {}, x.active_workers), h('td', { class: 'err' }, x.waiting_reason || ''))))),
    h('h3', {}, 'Queued jobs by priority'),
    h('table', { class: 'priorities' },
      h('thead', {}, h('tr', {}, h('th', {}, 'Priority'), h('th', {}, 'Queued'))),
      h('tbody', {}, Object.keys(q.by_priority).length ? Object.entries(q.by_priority).sort((a, b) => Number(b[0]) - Number(a[0])).map(([p, n]) => h('tr', {}, h('td', {}, p), h('td', {}, n)))
        : h('tr', {}, h('td', { colspan: 2, class: 'empty' }, 'nothing queued')))),
  );
}

// One message line for the schedules page, kept across re-renders: a re-render triggered by a schedule_event can
// land in the middle of an action, and must not drop what the action says (such as the link to a triggered job).
let scheduleMsg;

export async function schedulesView(el) {
  const msg = (scheduleMsg ||= h('div', { class: 'msg', id: 'schedule-msg' }));
  const act = async (path, after) => {
    try { const r = await api('POST', path); say(msg, r.message); after?.(r); await schedulesView.refresh(); } catch (e) { say(msg, e.message, false); }
  };
  const list = (await api('GET', '/schedules')).schedules;
  const form = h('form', { id: 'schedule-form', class: 'form inline', onsubmit: async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    let template;
    try { template = JSON.parse(String(f.get('template') || '{}')); } catch (err) { return say(msg, `job template is not JSON: ${err.message}`, false); }
    try {
      const r = await api('POST', '/schedules', { name: f.get('name'), schedule: f.get('cron'), enabled: f.get('enabled') === 'on', job_template: template });
      say(msg, r.message);
      await schedulesView.refresh();
    } catch (err) { say(msg, err.message, false); }
  } },
  h('label', {}, 'Name', h('input', { name: 'name', required: true })),
  h('label', {}, 'Cron (min hour day month weekday)', h('input', { name: 'cron', required: true, value: '0 2 * * *' })),
  h('label', {}, 'Job template (JSON)', h('textarea', { name: 'template', rows: 2 }, '{"operation": "noop", "parameters": {}}')),
  h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'enabled', checked: true }), ' enabled'),
  h('button', { type: 'submit', class: 'primary' }, 'Create schedule'));
  el.replaceChildren(
    h('h2', {}, 'Schedules'),
    h('table', { class: 'schedules' },
      h('thead', {}, h('tr', {}, ['Name', 'Cron', 'Enabled', 'Next run', 'Last run', 'Runs (ok / failed)', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, list.length ? list.map((s) => h('tr', { dataset: { id: s.id } },
        h('td', {}, s.name, h('br'), h('small', {}, s.id)), h('td', {}, h('code', {}, s.schedule), ` ${s.timezone}`),
        h('td', {}, s.enabled ? 'yes' : 'no'), h('td', {}, time(s.next_run)),
        h('td', {}, time(s.last_run), s.last_job_id ? h('div', {}, h('a', { href: `#/job/${encodeURIComponent(s.last_job_id)}` }, 'last job')) : ''),
        h('td', {}, `${s.run_count} (${s.successful_runs} / ${s.failed_runs})`),
        h('td', { class: 'actions' },
          h('button', { class: 'toggle', onclick: () => act(`/schedules/${encodeURIComponent(s.id)}/${s.enabled ? 'disable' : 'enable'}`) }, s.enabled ? 'Disable' : 'Enable'),
          h('button', { class: 'trigger', onclick: () => act(`/schedules/${encodeURIComponent(s.id)}/trigger`, (r) => {
            if (r.job_id) msg.append(' ', h('a', { href: `#/job/${encodeURIComponent(r.job_id)}`, class: 'triggered-job' }, 'open job'));
          }) }, 'Run now'),
          h('button', { class: 'danger', onclick: async () => { try { await api('DELETE', `/schedules/${encodeURIComponent(s.id)}`); await schedulesView.refresh(); } catch (e) { say(msg, e.message, false); } } }, 'Delete'))))
        : h('tr', {}, h('td', { colspan: 7, class: 'empty' }, 'no schedules')))),
    msg,
    h('h3', {}, 'New schedule'), form,
  );
  schedulesView.refresh = () => schedulesView(el);
}

const EVENTS = ['job.created', 'job.started', 'job.completed', 'job.failed', 'job.cancelled', 'schedule.triggered'];

export async function webhooksView(el) {
  const msg = h('div', { class: 'msg' });
  const { webhooks } = await api('GET', '/webhooks');
  const log = h('div', { class: 'deliveries' });
  const showLog = async (w) => {
    const r = await api('GET', `/webhooks/${w.index}/deliveries`);
    log.replaceChildren(h('h3', {}, `Deliveries to ${w.url}`), h('table', {},
      h('thead', {}, h('tr', {}, ['Event', 'Status', 'Attempts', 'HTTP', 'Duration', 'Last error', 'Updated'].map((t) => h('th', {}, t)))),
      h('tbody', {}, r.deliveries.length ? r.deliveries.map((d) => h('tr', {}, h('td', {}, d.event), h('td', { class: d.status === 'failed' ? 'err' : '' }, d.status),
        h('td', {}, `${d.attempts} / ${d.max_attempts}`), h('td', {}, d.response_status ?? ''), h('td', {}, d.duration_ms != null ? `${d.duration_ms} ms` : ''),
        h('td', {}, d.last_error || ''), h('td', {}, time(d.updated_at))))
        : h('tr', {}, h('td', { colspan: 7, class: 'empty' }, 'no deliveries yet')))));
  };
  const form = h('form', { class: 'form inline', onsubmit: async (e) => {
    e.preventDefault();
    const f = new FormData(form);
    try {
      const r = await api('POST', '/webhooks', { url: f.get('url'), events: f.getAll('events'), enabled: true });
      say(msg, r.message);
      await webhooksView(el);
    } catch (err) { say(msg, err.message, false); }
  } },
  h('label', {}, 'URL', h('input', { name: 'url', type: 'url', required: true, placeholder: 'https://hooks.example.com/ferry' })),
  h('fieldset', {}, h('legend', {}, 'Events'), EVENTS.map((ev) => h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'events', value: ev, checked: ev === 'job.completed' || ev === 'job.failed' }), ` ${ev}`))),
  h('button', { type: 'submit', class: 'primary' }, 'Add webhook'));
  el.replaceChildren(
    h('h2', {}, 'Webhooks'),
    h('table', { class: 'webhooks' },
      h('thead', {}, h('tr', {}, ['#', 'URL', 'Events', 'Enabled', ''].map((t) => h('th', {}, t)))),
      h('tbody', {}, webhooks.length ? webhooks.map((w) => h('tr', {},
        h('td', {}, w.index), h('td', {}, w.url), h('td', {}, w.events.join(', ')), h('td', {}, w.enabled ? 'yes' : 'no'),
        h('td', { class: 'actions' },
          h('button', { onclick: () => showLog(w) }, 'Delivery log'),
          h('button', { onclick: async () => { try { say(msg, (await api('POST', '/webhooks/test', { index: w.index })).message); } catch (e) { say(msg, e.message, false); } } }, 'Send test'),
          h('button', { class: 'danger', onclick: async () => { try { await api('DELETE', `/webhooks/${w.index}`); await webhooksView(el); } catch (e) { say(msg, e.message, false); } } }, 'Delete'))))
        : h('tr', {}, h('td', { colspan: 5, class: 'empty' }, 'no webhooks')))),
    msg, log,
    h('h3', {}, 'New webhook'), form,
  );
}
