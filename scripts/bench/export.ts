// npm run bench:export: export throughput from the vSphere simulator (vcsim, scripts/vcsim.sh) over loopback
// HTTPS, against curl fetching the same files (descriptor + flat extent of a monolithicFlat disk full of random
// data) in the same run. Ferry's figure is a whole export job's work (VM detail, file plan, downloads with
// sha256, state files, manifest) with one stream and with BENCH_STREAMS (default 4) streams.
// Target: Ferry with one stream >= 0.9x curl; several streams faster than one where the machine allows.
// Rounds interleave every measurement (load from other processes hits all alike); medians and best are printed.
// BENCH_MIB (default 512), BENCH_ROUNDS (default 5), BENCH_DIR (default /dev/shm when it has room, else tmp).
import { execFileSync, spawn } from 'node:child_process';
import { randomFillSync } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, rmSync, statfsSync, writeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { managerFor } from '../../shared/vsphere/client';
import { exportVm } from '../../shared/vsphere/export';
import { folderUrl } from '../../shared/vsphere/download';
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
const run = (cmd: string, args: string[]) => new Promise<void>((resolve, reject) => {
  const p = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  p.stderr.on('data', (d) => { err += d; });
  p.on('close', (c) => (c === 0 ? resolve() : reject(new Error(`${cmd} exited ${c}: ${err}`))));
});

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

    const res: Record<string, number[]> = { curl: [], one: [], many: [] };
    const curl = async () => {
      const t = process.hrtime.bigint();
      for (const [i, u] of files.entries()) await run('curl', ['-sS', '--fail', '--cacert', v.caFile, '-H', `Cookie: ${cookie}`, '-o', path.join(dir, `curl-${i}`), u]);
      const s = Number(process.hrtime.bigint() - t) / 1e9;
      for (let i = 0; i < files.length; i++) rmSync(path.join(dir, `curl-${i}`));
      return s;
    };
    const ferry = async (n: number) => {
      const t = process.hrtime.bigint();
      await exportVm({ creds, vmPath, outputDir: out, exportId: `bench-${n}`, parallel: n, signal: new AbortController().signal });
      const s = Number(process.hrtime.bigint() - t) / 1e9;
      rmSync(out, { recursive: true, force: true });
      return s;
    };
    await curl(); await ferry(1); // warm-up: page cache, TLS sessions, JIT
    for (let r = 0; r < rounds; r++) {
      res.curl.push(await curl());
      res.one.push(await ferry(1));
      res.many.push(await ferry(streams));
    }
    const mbs = (s: number) => `${(bytes / MIB / s).toFixed(0)} MiB/s`;
    const line = (k: string) => `${median(res[k]).toFixed(2)} s median (${mbs(median(res[k]))}), best ${Math.min(...res[k]).toFixed(2)} s`;
    const ratioOne = median(res.curl) / median(res.one);
    const ratioMany = median(res.one) / median(res.many);
    console.log(`export of a ${mib} MiB monolithicFlat disk from vcsim over loopback HTTPS, ${rounds} rounds, in ${dir.startsWith('/dev/shm') ? '/dev/shm' : os.tmpdir()}, ${os.cpus().length} CPUs`);
    console.log(`  curl (bare baseline, same files)   ${line('curl')}`);
    console.log(`  Ferry export, 1 stream             ${line('one')}  -> ${ratioOne.toFixed(2)}x curl; target >= 0.9x: ${ratioOne >= 0.9 ? 'met' : 'NOT met'}`);
    console.log(`  Ferry export, ${streams} streams            ${line('many')}  -> ${ratioMany.toFixed(2)}x one stream; ${ratioMany > 1 ? 'faster' : 'not faster on this machine'}`);
  } finally {
    await v.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
