// The operator's requests scripts/bench/fleet.ts measures, in one table for both places that run them: the
// measuring client under load (fleet-client.ts, its own process) and the quiet window's Redis profile (fleet.ts).
import { dashboardLoad, expect } from './fleet-probe';

export interface Route { name: string; call: (i: number) => Promise<void> }

/** `idPrefix` keeps the job ids each process submits apart. */
export function operatorRoutes(gw: string, daemon: string, idPrefix: string): Route[] {
  let seq = 0;
  return [
    { name: 'gateway GET /jobs?limit=100', call: async () => { await expect(gw, 'GET', '/jobs?limit=100', 200); } },
    { name: 'gateway GET /queue', call: async () => { await expect(gw, 'GET', '/queue', 200); } },
    { name: 'gateway GET /workers', call: async () => { await expect(gw, 'GET', '/workers', 200); } },
    { name: 'gateway POST /jobs?queue=true', call: async () => { await expect(gw, 'POST', '/jobs?queue=true', 201, { job_id: `${idPrefix}-${++seq}`, operation: 'noop', parameters: {} }); } },
    { name: 'daemon GET /jobs', call: async () => { await expect(daemon, 'GET', '/jobs', 200); } },
    { name: 'daemon GET /status', call: async () => { await expect(daemon, 'GET', '/status', 200); } },
    { name: 'dashboard first load', call: async () => { await dashboardLoad(daemon); } },
  ];
}
