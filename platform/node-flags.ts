// The node flags a service's process starts with, wherever it is started: the Dockerfile's CMD, deploy/k8s, `npm
// start` (scripts/cluster.ts) and the tests' processes (test/helpers/procs.ts). test/deploy/workers.test.ts holds
// the launches that cannot import this (the Dockerfile, the manifests, package.json) to the same list.
//
// The worker: `--initial-old-space-size=128`. V8 counts the buffers allocated since its last full collection
// against the old generation's headroom, and a worker's heap (30-40 MB live) gets about 20 MB of it. A disk copy
// receives every byte in a new buffer of 16 KiB (one per TLS record), so V8 started a full collection every 15-30
// MB received: in bench:datapath (a 12 GiB disk, 8 GiB of data) 567 of them, and 106 core-s of worker CPU, against
// 85 and 78 core-s with the flag (docs/performance.md, "Data path"). The cost is memory: up to 128 MB of garbage
// before a full collection, where the migration worker's Kubernetes limit is 3 GiB.
export const WORKER_NODE_FLAGS: readonly string[] = ['--initial-old-space-size=128'];

/** The flags for a service's entry script (`services/<name>/main.ts`, or its compiled `.js`). */
export function nodeFlagsFor(script: string): readonly string[] {
  return /(^|[\\/])services[\\/]worker[\\/]main\.[jt]s$/.test(script) ? WORKER_NODE_FLAGS : [];
}

/** The worker's flags a process was started without, from its `process.execArgv`. */
export function missingWorkerFlags(execArgv: readonly string[]): string[] {
  return WORKER_NODE_FLAGS.filter((f) => !execArgv.includes(f));
}
