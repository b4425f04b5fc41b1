// Which target host each VM of a plan goes to (docs/plans.md, "Destinations and placement"): the plan's
// destination.virt_uris (or its one virt_uri, or FERRY_LIBVIRT_URI), each one of FERRY_LIBVIRT_URIS (checked by
// the schema and again by the job). round_robin takes them in turn, in the order given; most_free_memory takes
// the host with the most free memory (libvirt's nodememstats: free + buffers + cached) after subtracting the
// memory of the plan's VMs already placed there. Unreachable hosts are skipped while another answers.
import { configuredUri } from '../libvirt/virsh';
import { targetFacts, type TargetFacts } from './target';
import type { Plan } from './types';

export const planUris = (p: Pick<Plan, 'destination'>): string[] =>
  p.destination.virt_uris?.length ? p.destination.virt_uris : [p.destination.virt_uri || configuredUri()];

export class Placer {
  private turn = 0;
  private reserved = new Map<string, number>();
  /** Bytes the plan's VMs will take in each pool of each host (the pool_space rule sums them in order). */
  readonly poolUse = new Map<string, Map<string, number>>();
  constructor(private policy: string, readonly targets: TargetFacts[]) {}

  static async of(p: Pick<Plan, 'destination'>) {
    return new Placer(p.destination.placement ?? 'round_robin', await Promise.all(planUris(p).map((u) => targetFacts(u))));
  }

  /** The host for a VM of `memoryMb`. */
  pick(memoryMb: number): TargetFacts {
    const up = this.targets.filter((t) => t.reachable);
    const from = up.length ? up : this.targets;
    let t: TargetFacts;
    if (this.policy === 'most_free_memory') {
      const room = (x: TargetFacts) => x.free_memory_bytes - (this.reserved.get(x.uri) ?? 0);
      t = from.reduce((best, x) => (room(x) > room(best) ? x : best));
    } else t = from[this.turn++ % from.length];
    this.reserved.set(t.uri, (this.reserved.get(t.uri) ?? 0) + memoryMb * 2 ** 20);
    if (!this.poolUse.has(t.uri)) this.poolUse.set(t.uri, new Map());
    return t;
  }
}
