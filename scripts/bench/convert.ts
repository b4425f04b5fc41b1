// npm run bench:convert: on one 1 GiB vmdk (written data, not just holes), compares bare `qemu-img convert`
// with the pipeline's convert stage, and that stage with checksum verification on top (sha256 read
// concurrently with the conversion). Targets: pipeline <= 5% slower; checksum <= 15% over conversion alone.
import { execFileSync } from 'node:child_process';
import { promises as fs, openSync, writeSync, closeSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { sha256File } from '../../shared/qemu';
import { validateManifest } from '../../shared/schemas/manifest';
import { runPipeline } from '../../services/converter/pipeline';

const MIB = Number(process.env.BENCH_MIB || 1024);
const ROUNDS = Number(process.env.BENCH_ROUNDS || 3);

async function main() {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'ferry-bench-convert-'));
  try {
    const raw = path.join(dir, 'src.raw');
    execFileSync('qemu-img', ['create', '-f', 'raw', raw, `${MIB}M`]);
    const fd = openSync(raw, 'r+');
    const chunk = Buffer.alloc(1024 * 1024);
    for (let i = 0; i < MIB; i += 2) { chunk.fill(i % 251); writeSync(fd, chunk, 0, chunk.length, i * 1024 * 1024); } // half the disk written
    closeSync(fd);
    const vmdk = path.join(dir, 'src.vmdk');
    execFileSync('qemu-img', ['convert', '-f', 'raw', '-O', 'vmdk', raw, vmdk]);
    await fs.rm(raw);
    const sha = await sha256File(vmdk);
    const bytes = MIB * 1024 * 1024;
    const manifest = (checksum: boolean, out: string) => validateManifest({
      manifest_version: '1.0', disks: [{ id: 'd', source_format: 'vmdk', bytes, local_path: vmdk, ...(checksum ? { checksum: `sha256:${sha}` } : {}) }],
      pipeline: { convert: { enabled: true } }, output: { directory: out }, options: { report: { enabled: false } },
    });
    const time = async (fn: () => Promise<unknown> | unknown) => { const t = process.hrtime.bigint(); await fn(); return Number(process.hrtime.bigint() - t) / 1e9; };
    const res = { bare: [] as number[], pipeline: [] as number[], checksum: [] as number[], stage: [] as number[], stageSum: [] as number[] };
    for (let r = 0; r < ROUNDS; r++) {
      const out = path.join(dir, `o${r}`);
      await fs.mkdir(out);
      res.bare.push(await time(() => execFileSync('qemu-img', ['convert', '-f', 'vmdk', '-O', 'qcow2', vmdk, path.join(out, 'bare.qcow2')])));
      res.pipeline.push(await time(async () => { const x = await runPipeline(manifest(false, path.join(out, 'p'))); if (!x.success) throw new Error(x.errors.join()); res.stage.push(x.stages.convert.duration_seconds); }));
      res.checksum.push(await time(async () => { const x = await runPipeline(manifest(true, path.join(out, 'c'))); if (!x.success) throw new Error(x.errors.join()); res.stageSum.push(x.stages.convert.duration_seconds); }));
      await fs.rm(out, { recursive: true });
    }
    const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
    const b = med(res.bare); const p = med(res.pipeline); const c = med(res.checksum);
    const pct = (x: number, y: number) => ((x / y - 1) * 100).toFixed(1);
    console.log(`convert benchmark: ${MIB} MiB vmdk -> qcow2, median of ${ROUNDS} rounds, ${os.cpus().length} CPUs`);
    console.log(`  bare qemu-img convert        ${b.toFixed(2)} s`);
    const s = med(res.stage); const sc = med(res.stageSum);
    console.log(`  pipeline convert stage       ${s.toFixed(2)} s  (${pct(s, b)}% vs bare; target <= 5%)`);
    console.log(`  convert stage + sha256       ${sc.toFixed(2)} s  (${pct(sc, s)}% over conversion alone; target <= 15%)`);
    console.log(`  whole pipeline run           ${p.toFixed(2)} s without checksum, ${c.toFixed(2)} s with (adds inspect and the output's sha256)`);
  } finally { await fs.rm(dir, { recursive: true, force: true }); }
}
main().catch((e) => { console.error(e); process.exit(1); });
