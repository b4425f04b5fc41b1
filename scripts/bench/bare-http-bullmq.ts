// The second throughput baseline for scripts/bench/queue.ts: bare BullMQ behind a bare Node HTTP endpoint, in
// the same process layout as Ferry (an API process, a worker process, the client), with none of Ferry's contract:
// no validation, no job record, no history, no counters, no queue position, no leases.
//   server <redis-url> <queue> <prefix>: POST /jobs -> Queue.add -> 201 {job_id}; prints its port.
//   worker <redis-url> <queue> <prefix> <concurrency>: a no-op Worker that PUBLISHes each finished job's id on
//   <prefix>:done (Ferry's client sees COMPLETED through one subscription too); prints "ready".
import http from 'node:http';
import IORedis from 'ioredis';
import { Queue, Worker, type ConnectionOptions } from 'bullmq';

const [role, url, name, prefix, conc] = process.argv.slice(2);
// ioredis takes `url` at run time, but its typed options have no such field: cast at the library's boundary.
const connection = { url, maxRetriesPerRequest: null } as ConnectionOptions;
/** What queue.ts's client posts to /jobs: a job spec, of which only job_id is read here. */
interface BenchSpec { job_id: string }

async function main() {
  if (role === 'server') {
    const q = new Queue<BenchSpec>(name, { connection, prefix });
    await q.waitUntilReady();
    const server = http.createServer((req, res) => {
      let body = '';
      req.setEncoding('utf8').on('data', (s: string) => { body += s; }).on('end', () => void (async () => { // answers its own failure (500 below)
        try {
          const spec = JSON.parse(body) as BenchSpec; // posted by queue.ts's bullmq client
          await q.add('job', spec, { jobId: `j_${spec.job_id}`, priority: 51, removeOnComplete: true, removeOnFail: true, attempts: 1 });
          res.writeHead(201, { 'Content-Type': 'application/json' }).end(JSON.stringify({ job_id: spec.job_id }));
        } catch (e) { res.writeHead(500).end(String(e)); }
      })());
    });
    server.keepAliveTimeout = 60_000;
    server.listen(0, '127.0.0.1', () => process.stdout.write(`${(server.address() as { port: number }).port}\n`));
  } else {
    const pub = new IORedis(url);
    const w = new Worker<BenchSpec>(name, async (job) => { await pub.publish(`${prefix}:done`, job.data.job_id); return { ok: true }; }, { connection, prefix, concurrency: Number(conc) });
    await w.waitUntilReady();
    process.stdout.write('ready\n');
  }
}
process.on('SIGTERM', () => process.exit(0));
main().catch((e: unknown) => { process.stderr.write(`${(e instanceof Error && e.stack) || String(e)}\n`); process.exit(1); });
