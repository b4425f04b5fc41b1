// Operation "virt_console" (internal: the daemon's /virt/console WebSocket when FERRY_LIBVIRT_VIA=worker,
// orchestration/console-jobs.ts): `virsh console` runs here (openConsole), its bytes relayed over the job's two Redis
// channels. It ends when the console ends (the domain stopped, the console taken), when the daemon says close,
// or when the job is cancelled; the daemon is told `closed` each time. Every message is sealed with FERRY_SECRET_KEY
// (consoleSeal); without the key the job fails, not retried, as one holding sealed credentials does.
import { jobUri } from '../../../domain/libvirt/uri';
import { Virsh } from '../../../domain/libvirt/virsh';
import { openConsole } from '../../../domain/libvirt/console';
import { createRedis } from '../../../platform/redis';
import { ignoreError } from '../../../platform/log';
import { OperationError } from '../../../platform/errors';
import { consoleChannels, consoleSeal, consoleUnsealable, type ConsoleMessage } from '../../../orchestration/console-jobs';
import type { Operation } from './types';

export const virtConsole: Operation = async (ctx) => {
  const p = ctx.spec.parameters as { uri: string; name: string; force: boolean };
  const v = new Virsh(jobUri(p.uri, 'parameters.uri')); // again here: the worker's own FERRY_LIBVIRT_URIS decide
  const unsealable = consoleUnsealable();
  if (unsealable) throw new OperationError(unsealable, false);
  const ch = consoleChannels(ctx.store, ctx.spec.job_id);
  const box = consoleSeal(ctx.spec.job_id, ch.out, ch.in);
  const say = (m: ConsoleMessage) => void ctx.store.redis.publish(ch.out,
    box.seal(m)).catch(ignoreError('console output to the daemon was lost', { job_id: ctx.spec.job_id }));
  const sub = createRedis();
  try {
    await sub.subscribe(ch.in); // before attaching: the daemon types only after 'ready'
    const con = openConsole(v, p.name, p.force);
    sub.on('message', (_c: string, raw: string) => {
      const m = box.open(raw);
      if (m?.type === 'input') con.write(Buffer.from(m.data, 'latin1'));
      else if (m?.type === 'close') con.close();
    });
    const onAbort = () => con.close();
    ctx.signal.addEventListener('abort', onAbort, { once: true });
    con.on('ready', () => say({ type: 'ready' }));
    con.on('data', (text: string) => say({ type: 'data', data: text }));
    const error = await new Promise<string>((resolve) => con.on('close', (_code: number, e: string) => resolve(e)));
    ctx.signal.removeEventListener('abort', onAbort);
    say({ type: 'closed', ...(error ? { error } : {}) });
    return { domain: p.name, ended: error || 'closed' };
  } finally {
    sub.disconnect();
  }
};
