// npm run bench:virt: the /virt API beside bare virsh on the run's own private libvirtd (test/helpers/libvirt.ts),
// with 40 defined domains of which 8 run (TCG guests: the host kernel and a busybox initramfs).
//   GET /virt/domains   vs  bare `virsh list --all`        target: p50 within 1.3x
//   GET /virt/stats/all vs  bare `virsh domstats --list-running`  target: p50 within 1.3x
//   POST /import/kvm of a 1 GiB image into the pool  vs  `cp` of the same file  target: within 1.05x
// Requests and bare commands alternate in the same loop, so load from other processes hits both alike.
// BENCH_ROUNDS (default 60), BENCH_IMPORT_ROUNDS (default 5), BENCH_MIB (default 1024), BENCH_DIR (default /var/tmp:
// the pool is a real disk folder, as on a host).
import { execFile } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import { closeSync, openSync, promises as fs, writeFileSync, writeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { guestXml } from '../../test/helpers/libvirt';
import { startVirtStack } from '../../test/virt/stack';

const run = promisify(execFile);
const ROUNDS = Number(process.env.BENCH_ROUNDS || 60);
const IMPORT_ROUNDS = Number(process.env.BENCH_IMPORT_ROUNDS || 5);
const MIB = Number(process.env.BENCH_MIB || 1024);
const pct = (a: number[], p: number) => [...a].sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor((a.length * p) / 100))];
const ms = (n: number) => `${n.toFixed(1)} ms`;
const time = async (fn: () => Promise<unknown>) => { const t = process.hrtime.bigint(); await fn(); return Number(process.hrtime.bigint() - t) / 1e6; };

async function main() {
  const base = process.env.BENCH_DIR || '/var/tmp';
  const s = await startVirtStack({ LOG_LEVEL: 'warn', FERRY_INPUT_ROOTS: `${os.tmpdir()}:${base}` });
  const work = await fs.mkdtemp(path.join(base, 'ferry-bench-virt-'));
  try {
    const virsh = (args: string[]) => run('virsh', ['-q', '-c', s.lv.uri, ...args], { maxBuffer: 64 << 20 });
    for (let i = 1; i <= 40; i++) {
      const f = path.join(s.dir, `bench-${i}.xml`);
      writeFileSync(f, guestXml(`bench-${i}`, { memoryMiB: 64 }));
      await virsh(['define', f]);
    }
    for (let i = 1; i <= 8; i++) await virsh(['start', `bench-${i}`]);
    const get = async (p: string) => { const r = await fetch(s.daemon.url + p); if (r.status !== 200) throw new Error(`${p}: ${r.status} ${await r.text()}`); await r.arrayBuffer(); };
    const t = { list: [] as number[], bareList: [] as number[], stats: [] as number[], bareStats: [] as number[] };
    await get('/virt/domains'); await get('/virt/stats/all'); // warm-up (and the first CPU sample)
    for (let i = 0; i < ROUNDS; i++) {
      t.list.push(await time(() => get('/virt/domains')));
      t.bareList.push(await time(() => virsh(['list', '--all'])));
      t.stats.push(await time(() => get('/virt/stats/all')));
      t.bareStats.push(await time(() => virsh(['domstats', '--list-running'])));
    }
    const line = (name: string, a: number[], b: number[], bare: string) => {
      const r = pct(a, 50) / pct(b, 50);
      console.log(`${name}: p50 ${ms(pct(a, 50))} p99 ${ms(pct(a, 99))} | bare ${bare}: p50 ${ms(pct(b, 50))} p99 ${ms(pct(b, 99))} | p50 ratio ${r.toFixed(2)}x (target 1.3x: ${r <= 1.3 ? 'met' : 'NOT met'})`);
    };
    console.log(`40 defined, 8 running domains; ${ROUNDS} rounds`);
    line('GET /virt/domains', t.list, t.bareList, 'virsh list --all');
    line('GET /virt/stats/all', t.stats, t.bareStats, 'virsh domstats --list-running');

    // Import of a 1 GiB image (random bytes: nothing sparse to skip) beside cp of the same file into the same pool folder.
    const img = path.join(work, 'disk.img');
    const fd = openSync(img, 'w');
    const chunk = Buffer.alloc(16 << 20);
    for (let i = 0; i < MIB; i += 16) { randomFillSync(chunk); writeSync(fd, chunk); }
    closeSync(fd);
    const poolDir = path.join(work, 'pool');
    await fs.mkdir(poolDir);
    await virsh(['pool-define-as', 'bench', 'dir', '--target', poolDir]);
    await virsh(['pool-start', 'bench']);
    const imp: number[] = [];
    const cp: number[] = [];
    // The order alternates each round: whichever runs second finds the source in the page cache.
    for (let i = 0; i < IMPORT_ROUNDS; i++) {
      const doImport = async () => {
        imp.push(await time(async () => {
          const r = await fetch(`${s.daemon.url}/import/kvm`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ image_path: img, vm_name: `imp-${i}`, memory: 64, pool: 'bench' }) });
          if (r.status !== 201) throw new Error(`import: ${r.status} ${await r.text()}`);
        }));
        await virsh(['undefine', `imp-${i}`, '--remove-all-storage']);
      };
      const doCp = async () => {
        const dest = path.join(poolDir, `cp-${i}.img`);
        cp.push(await time(() => run('cp', [img, dest])));
        await fs.rm(dest);
      };
      if (i % 2) { await doCp(); await doImport(); } else { await doImport(); await doCp(); }
    }
    const r = pct(imp, 50) / pct(cp, 50);
    console.log(`POST /import/kvm ${MIB} MiB: median ${ms(pct(imp, 50))} (runs ${imp.map((x) => x.toFixed(0)).join(', ')}) | bare cp: median ${ms(pct(cp, 50))} (runs ${cp.map((x) => x.toFixed(0)).join(', ')}) | ratio ${r.toFixed(2)}x (target 1.05x: ${r <= 1.05 ? 'met' : 'NOT met'})`);
  } finally {
    await fs.rm(work, { recursive: true, force: true });
    await s.stop();
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
