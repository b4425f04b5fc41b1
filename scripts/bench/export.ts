// npm run bench:export: export throughput from the vSphere simulator (vcsim, scripts/vcsim.sh) over loopback
// HTTPS, against curl fetching the same files (descriptor + flat extent of a monolithicFlat disk full of random
// data) in the same run. Ferry's figure is a whole export job's work (VM detail, file plan, downloads with
// sha256, state files, manifest) with one stream and with BENCH_STREAMS (default 4) streams.
// Target: Ferry with one stream >= 0.9x curl; several streams faster than one where the machine allows.
// Rounds interleave every measurement (load from other processes hits all alike); medians and best are printed.
// Two bare Node clients in the same rounds show the floor: the same GET with undici into a file, without and with
// sha256 inline (the least any Node client doing what an export must do can cost), and the CPU seconds each side
// spends (vcsim's from /proc, curl's from its rusage), since on a 2-core machine the simulator takes one of them.
// BENCH_MIB (default 512), BENCH_ROUNDS (default 5), BENCH_DIR (default /dev/shm when it has room, else tmp).
import { execFileSync, spawn } from 'node:child_process';
import { createHash, randomFillSync } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, promises as fsp, readFileSync, rmSync, statfsSync, writeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { request } from 'undici';
import { managerFor } from '../../domain/vsphere/client';
import { exportVm } from '../../domain/vsphere/export';
import { folderUrl } from '../../domain/vsphere/download';
import { startVcsim } from '../../test/helpers/vcsim';
import { createVm, upload } from '../../test/vsphere/fixture';

const MIB = 1024 * 1024;
const mib = Number(process.env.BENCH_MIB || 512);
const rounds = Number(process.env.BENCH_ROUNDS || 5);
const streams = Number(process.env.BENCH_STREAMS || 4);

function benchDir(): string {
  if (process.env.BENCH_DIR) return process.env.BENCH_DIR;
  try { const s = statfsSync('/dev/shm'); if (s.bavail * s.bsize > mib * MIB * 4) return '/dev/shm'; } catch { /* no tmpfs */ }
  return os.tmpdir();
}

const median = (a: number[]) => { const s = [...a].sort((x, y) => x - y); return s[Math.floor(s.length / 2)]; };
/** Runs a command under GNU time; resolves to its CPU seconds (user + system). */
const run = (cmd: string, args: string[]) => new Promise<number>((resolve, reject) => {
  const p = spawn('/usr/bin/time', ['-f', 'FERRY-CPU %U %S', cmd, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  p.stderr.on('data', (d) => { err += d; });
  p.on('close', (c) => {
    const m = /FERRY-CPU ([\d.]+) ([\d.]+)/.exec(err);
    if (c === 0 && m) resolve(Number(m[1]) + Number(m[2])); else reject(new Error(`${cmd} exited ${c}: ${err}`));
  });
});
/** CPU seconds a process has used so far (utime + stime from /proc). */
const procCpu = (pid: number) => {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) / 100;
};
/** CPU seconds this process uses while `fn` runs (its threads included). */
const selfCpu = async (fn: () => Promise<void>) => { const c = process.cpuUsage(); await fn(); const d = process.cpuUsage(c); return (d.user + d.system) / 1e6; };

async function main() {
  const dir = mkdtempSync(path.join(benchDir(), 'ferry-bench-export-'));
  const v = await startVcsim({ password: 'bench-pw' });
  try {
    process.env.FERRY_VSPHERE_CA = v.caFile;
    // The datastore lives in vcsim's temp dir; the source disk is made, uploaded and then removed locally.
    const raw = path.join(dir, 'src.raw');
    const fd = openSync(raw, 'w');
    const buf = Buffer.alloc(8 * MIB);
    for (let i = 0; i < mib / 8; i++) { randomFillSync(buf); writeSync(fd, buf); }
    closeSync(fd);
    const flat = path.join(dir, 'big.vmdk');
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', '-o', 'subformat=monolithicFlat', raw, flat]);
    rmSync(raw);
    const creds = { url: v.url, username: v.username, password: v.password };
    const m = managerFor(creds);
    const vmPath = await createVm(m, { name: 'bench', disks: [{ file: 'bench/big.vmdk', bytes: mib * MIB }] });
    await upload(v, flat, 'bench/big.vmdk');
    await upload(v, path.join(dir, 'big-flat.vmdk'), 'bench/big-flat.vmdk');
    rmSync(flat); rmSync(path.join(dir, 'big-flat.vmdk'));
    const cookie = await m.sessionCookie();
    const files = ['bench/big.vmdk', 'bench/big-flat.vmdk'].map((p) => folderUrl(m, { datastore: 'LocalDS_0', path: p, dcPath: 'DC0' }).href);
    const bytes = mib * MIB; // the extent; the descriptor is ~0.5 KiB
    const out = path.join(dir, 'out');

    const kinds = ['curl', 'bare', 'bareHash', 'one', 'many'] as const;
    type Kind = typeof kinds[number];
    const wall: Record<Kind, number[]> = { curl: [], bare: [], bareHash: [], one: [], many: [] };
    const cpu: Record<Kind, number[]> = { curl: [], bare: [], bareHash: [], one: [], many: [] };
    const simCpu: Record<Kind, number[]> = { curl: [], bare: [], bareHash: [], one: [], many: [] };
    let curlCpu = 0;
    const curl = async () => {
      curlCpu = 0;
      for (const [i, u] of files.entries()) curlCpu += await run('curl', ['-sS', '--fail', '--cacert', v.caFile, '-H', `Cookie: ${cookie}`, '-o', path.join(dir, `curl-${i}`), u]);
      for (let i = 0; i < files.length; i++) rmSync(path.join(dir, `curl-${i}`));
    };
    // The bare Node client: one undici GET per file through Ferry's own agent, 1 MiB writev batches with one
    // write in flight (as Ferry writes), optionally sha256 of every chunk as it arrives. No state, no progress.
    const bare = (hash: boolean) => async () => {
      for (const [i, u] of files.entries()) {
        const h = hash ? createHash('sha256') : undefined;
        const fh = await fsp.open(path.join(dir, `bare-${i}`), 'w');
        const r = await request(u, { dispatcher: m.agent, headers: { cookie } });
        let batch: Buffer[] = []; let len = 0; let at = 0; let inflight: Promise<unknown> = Promise.resolve();
        for await (const chunk of r.body) {
          const b = chunk as Buffer;
          h?.update(b);
          batch.push(b); len += b.length;
          if (len >= MIB) { await inflight; inflight = fh.writev(batch, at); at += len; batch = []; len = 0; }
        }
        await inflight;
        if (len) await fh.writev(batch, at);
        h?.digest('hex');
        await fh.close();
        rmSync(path.join(dir, `bare-${i}`));
      }
    };
    const ferry = (n: number) => async () => {
      await exportVm({ creds, vmPath, outputDir: out, exportId: `bench-${n}`, parallel: n, signal: new AbortController().signal });
      rmSync(out, { recursive: true, force: true });
    };
    const fns: Record<Kind, () => Promise<void>> = { curl, bare: bare(false), bareHash: bare(true), one: ferry(1), many: ferry(streams) };
    // Each measurement starts with a clean heap, so that one client's garbage is not collected on the next one's time.
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const measure = async (k: Kind) => {
      gc();
      const sim0 = procCpu(v.proc.pid!);
      const t = process.hrtime.bigint();
      const c = await selfCpu(fns[k]);
      wall[k].push(Number(process.hrtime.bigint() - t) / 1e9);
      cpu[k].push(k === 'curl' ? curlCpu : c);
      simCpu[k].push(procCpu(v.proc.pid!) - sim0);
    };
    for (const k of kinds) await fns[k](); // warm-up: page cache, TLS sessions, JIT
    for (let r = 0; r < rounds; r++) for (const k of kinds) await measure(k);

    const mbs = (s: number) => `${(bytes / MIB / s).toFixed(0)} MiB/s`;
    const med = (k: Kind) => median(wall[k]);
    const line = (k: Kind) => `${med(k).toFixed(2)} s median (${mbs(med(k))}), best ${Math.min(...wall[k]).toFixed(2)} s; CPU ${median(cpu[k]).toFixed(2)} s client + ${median(simCpu[k]).toFixed(2)} s vcsim`;
    const x = (a: Kind, b: Kind) => med(b) / med(a);
    const ratioOne = x('one', 'curl');
    const ratioMany = med('one') / med('many');
    const ncpu = os.cpus().length;
    // What the hardware allows a hashing Node client at best: its CPU and vcsim's spread perfectly over every core.
    const bound = (median(cpu.bareHash) + median(simCpu.bareHash)) / ncpu;
    console.log(`export of a ${mib} MiB monolithicFlat disk from vcsim over loopback HTTPS, ${rounds} rounds, in ${dir.startsWith('/dev/shm') ? '/dev/shm' : os.tmpdir()}, ${ncpu} CPUs, load ${os.loadavg()[0].toFixed(1)}`);
    console.log(`  curl (bare baseline, same files)        ${line('curl')}`);
    console.log(`  bare Node GET -> file, no hash         ${line('bare')}  -> ${x('bare', 'curl').toFixed(2)}x curl`);
    console.log(`  bare Node GET + sha256 -> file         ${line('bareHash')}  -> ${x('bareHash', 'curl').toFixed(2)}x curl (the floor of the work an export must do)`);
    console.log(`  Ferry export, 1 stream                  ${line('one')}  -> ${ratioOne.toFixed(2)}x curl, ${x('one', 'bareHash').toFixed(2)}x the bare hashing client; target >= 0.9x curl: ${ratioOne >= 0.9 ? 'met' : 'NOT met'}`);
    console.log(`  Ferry export, ${streams} streams                 ${line('many')}  -> ${ratioMany.toFixed(2)}x one stream; ${ratioMany > 1 ? 'faster' : 'not faster on this machine'}`);
    console.log(`  ceiling for a hashing Node client here: (its CPU + vcsim's) / ${ncpu} cores = ${bound.toFixed(2)} s -> at best ${(med('curl') / bound).toFixed(2)}x curl`);
  } finally {
    await v.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
