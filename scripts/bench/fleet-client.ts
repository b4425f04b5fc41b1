// The measuring client of scripts/bench/fleet.ts under load, in a process of its own: the bench's process also
// runs the simulated fleet, whose 500 streaming clients take in thousands of WebSocket frames and SSE events a
// second, and a request timed there would include waiting for that event loop. Started with fork(); takes one
// message { gw, daemon, samples }, answers { results, resets } or { error }, and exits.
import { errorText } from '../../platform/errors';
import { resets, timeSeq } from './fleet-probe';
import { operatorRoutes } from './fleet-routes';

export interface ClientAsk { gw: string; daemon: string; samples: number }
export type ClientAnswer = { results: { name: string; samples: number[] }[]; resets: number } | { error: string };

// The bench gone (stopped mid-run): nobody to answer.
process.once('disconnect', () => process.exit(1));
process.once('message', (ask: ClientAsk) => {
  void (async (): Promise<ClientAnswer> => {
    const results: { name: string; samples: number[] }[] = [];
    for (const r of operatorRoutes(ask.gw, ask.daemon, `fleet-new-client-${process.pid}`)) results.push({ name: r.name, samples: await timeSeq(ask.samples, r.call) });
    return { results, resets: resets.count };
  })().catch((e: unknown) => ({ error: errorText(e) })).then((answer) => process.send!(answer, () => process.exit(0)));
});
