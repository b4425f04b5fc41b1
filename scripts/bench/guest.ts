// npm run bench:guest (issues 12 and 20): Debian's virt-v2v and Ferry on the same real guest disk (the Debian guest
// fixtures, test/fixtures/debian-guest.ts, every variant), one after the other in one run. For each: wall
// time, peak memory of the whole process tree (the libguestfs appliance's qemu included), output size, and whether
// the output boots on virtio-blk with a virtio NIC (the product's virt_test runner, domain/converter/testboot.ts,
// under TCG, awaiting the guest's marker or the initramfs giving up), and Ferry's repair stage (its report's
// `fix_side_by_side` timing). Targets (issue 34): Ferry's output boots on every variant, its repair stage <= 45 s, and
// its wall time <= 0.45x virt-v2v's where virt-v2v makes an output.
//   virt-v2v -i disk <vmdk> -o local -os <dir> -of qcow2        (LIBGUESTFS_BACKEND_SETTINGS=force_tcg)
//   ferry-convert --config <yaml>                                (mode local, every repair on, no virt_test)
// The netplan variant has two disks (its data disk is required for boot): virt-v2v reads a libvirt domain XML
// naming both (`-i libvirtxml`), ferry-convert a manifest of both (`--manifest`, the same repairs).
// The boots are not timed: they check the outputs, each with the firmware its guest needs (the UEFI variant under
// OVMF with a fresh NVRAM, as a new KVM domain gets), every output disk on virtio-blk. BENCH_VARIANTS (default every
// variant), BENCH_DIR (default the OS temp dir),
// BENCH_BOOT_TIMEOUT seconds (default 600).
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fs, readFileSync, readdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { converterConfigSchema } from '../../domain/schemas/converter-config';
import { testBoot } from '../../domain/converter/testboot';
import { outputNames } from '../../domain/converter/pipeline';
import { buildXml } from '../../domain/libvirt/xml';
import { validateManifest } from '../../domain/schemas/manifest';
import { DEBIAN_VARIANTS, ensureDebianGuest, repairManifest, DebianGuest, DebianVariant } from '../../test/fixtures/debian-guest';

const ROOT = path.resolve(__dirname, '..', '..');
const FERRY = path.join(ROOT, 'services', 'converter', 'ferry-convert.js');
const BOOT_TIMEOUT = Number(process.env.BENCH_BOOT_TIMEOUT || 600);
const INITRAMFS_GAVE_UP = /Gave up waiting for root file system device|ALERT! \S+ does not exist|Dropping to a shell|Kernel panic|emergency mode/;
/** The guest's own verdict when / is read-write but no interface holds its address (it booted, the network did not). */
const NOT_READY = /FERRY-GUEST-NOT-READY[^\r\n]*/;

interface Run { tool: string; variant: DebianVariant; ok: boolean; seconds: number; peakMiB: number; outputs?: string[]; outBytes?: number; boot?: string; boots?: boolean; note?: string; repairSeconds?: number }

const REPAIR_TARGET = 45;
const RATIO_TARGET = 0.45;

/** The repair stage's seconds from the report ferry-convert wrote in `out` (undefined without one). */
async function repairSeconds(out: string): Promise<number | undefined> {
  const report = await fs.readFile(path.join(out, 'report.json'), 'utf8').catch(noOutput);
  if (!report) return undefined;
  const t = (JSON.parse(report) as { summary?: { timings?: Record<string, number> } }).summary?.timings?.fix_side_by_side;
  return typeof t === 'number' ? t : undefined;
}

/** RSS (KiB) of every process that carries `tag` in its environment or descends from `root`: guestfish's server
 *  daemonises (its parent becomes init), but it and the appliance's qemu inherit the environment. */
function treeRssKiB(root: number, tag: string): number {
  const procs = new Map<number, { ppid: number; rss: number; tagged: boolean }>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      const rss = Number(f[21]) * 4; // pages of 4 KiB
      let tagged = false;
      try { tagged = readFileSync(`/proc/${d}/environ`, 'latin1').includes(tag); } catch { /* gone or not ours */ }
      procs.set(Number(d), { ppid: Number(f[1]), rss, tagged });
    } catch { /* exited while listing */ }
  }
  let sum = 0;
  for (const [pid, p] of procs) {
    let q: number | undefined = pid;
    let inTree = p.tagged;
    for (let hops = 0; !inTree && q && hops < 64; hops++) { if (q === root) inTree = true; q = procs.get(q)?.ppid; }
    if (inTree) sum += p.rss;
  }
  return sum;
}

/** Runs a command, sampling its tree's memory every 250 ms; resolves with wall time, peak and output. */
function measured(cmd: string, args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; seconds: number; peakMiB: number; log: string }> {
  const tag = `FERRY_BENCH_TAG=${randomBytes(8).toString('hex')}`;
  const [k, v] = tag.split('=');
  const t0 = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: { ...env, [k]: v }, stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    let peak = 0;
    const sample = () => { peak = Math.max(peak, treeRssKiB(child.pid!, tag)); };
    const timer = setInterval(sample, 250);
    child.stdout.on('data', (b) => { log += b; });
    child.stderr.on('data', (b) => { log += b; });
    child.on('error', (e) => { clearInterval(timer); reject(e); });
    child.on('close', (code) => {
      clearInterval(timer);
      resolve({ code, seconds: Number(process.hrtime.bigint() - t0) / 1e9, peakMiB: peak / 1024, log });
    });
  });
}

/** The guest's source disks: the system disk, then the data disk where the variant has one. */
const sourceDisks = (g: DebianGuest) => [g.vmdk, ...(g.dataVmdk ? [g.dataVmdk] : [])];
/** The i-th SATA disk's name, as the source domain names it and virt-v2v names its output after it. */
const sataDev = (i: number) => `sd${'abcdefghijklmnopqrstuvwxyz'[i]}`;

/** Bytes allocated to every file of `files`; undefined when one is missing (the tool made no whole output). */
async function allocated(files: string[]): Promise<number | undefined> {
  const sizes = await Promise.all(files.map((f) => fs.stat(f).then((st) => st.blocks * 512, noOutput)));
  return sizes.some((x) => x === undefined) ? undefined : sizes.reduce<number>((a, b) => a + (b ?? 0), 0);
}

async function bootsOnVirtio(g: DebianGuest, disks: string[], format: string, logFile: string): Promise<{ boots: boolean; detail: string }> {
  const r = await testBoot({
    name: `ferry-bench-${g.variant}`, disks: disks.map((d) => ({ path: d, format })), bus: 'virtio', nic: 'virtio', firmware: g.nvram ? 'uefi' : 'bios',
    expect: new RegExp(`${g.ready.source}|${NOT_READY.source}|${INITRAMFS_GAVE_UP.source}`), timeoutSeconds: BOOT_TIMEOUT, consoleLog: logFile,
  });
  const text = await fs.readFile(logFile, 'latin1');
  const m = g.ready.exec(text);
  if (m) return { boots: true, detail: `marker after ${r.seconds.toFixed(0)} s, iface ${m[1]}` };
  const half = NOT_READY.exec(text);
  if (half) return { boots: false, detail: `userspace up but not the network: "${half[0].trim()}" after ${r.seconds.toFixed(0)} s` };
  const bad = INITRAMFS_GAVE_UP.exec(text);
  return { boots: false, detail: bad ? `"${bad[0]}" after ${r.seconds.toFixed(0)} s` : `${r.status}: ${r.detail}` };
}

async function virtV2v(g: DebianGuest, dir: string): Promise<Run> {
  const os_ = path.join(dir, 'v2v');
  await fs.mkdir(os_);
  const env = { ...process.env, LIBGUESTFS_BACKEND: 'direct', LIBGUESTFS_BACKEND_SETTINGS: process.env.LIBGUESTFS_BACKEND_SETTINGS || 'force_tcg' };
  const disks = sourceDisks(g);
  const input = disks.length === 1 ? ['-i', 'disk', g.vmdk] : ['-i', 'libvirtxml', await domainXml(g, dir, disks)];
  const r = await measured('virt-v2v', [...input, '-o', 'local', '-os', os_, '-of', 'qcow2', '-on', `v2v-${g.variant}`], env);
  await fs.writeFile(path.join(dir, 'virt-v2v.log'), r.log);
  const outputs = disks.map((_d, i) => path.join(os_, `v2v-${g.variant}-${sataDev(i)}`));
  const outBytes = await allocated(outputs);
  const ok = r.code === 0 && outBytes !== undefined;
  return { tool: 'virt-v2v', variant: g.variant, ok, seconds: r.seconds, peakMiB: r.peakMiB, outputs: ok ? outputs : undefined, outBytes,
    note: ok ? undefined : `exit ${r.code}: ${(r.log.match(/^virt-v2v: error: .*$/m)?.[0] ?? r.log.trim().split('\n').slice(-3).join(' | '))}` };
}

/** A libvirt domain of the guest as it runs on VMware (SATA disks, an e1000 NIC with its MAC), for virt-v2v's
 *  `-i libvirtxml`: the one input of Debian's virt-v2v that takes several local disks. */
async function domainXml(g: DebianGuest, dir: string, disks: string[]): Promise<string> {
  const xml = buildXml({ domain: {
    '@_type': 'kvm', name: `v2v-${g.variant}`, memory: { '@_unit': 'MiB', '#text': '1024' }, vcpu: '1',
    os: { type: { '@_arch': 'x86_64', '#text': 'hvm' } },
    devices: {
      disk: disks.map((d, i) => ({ '@_type': 'file', '@_device': 'disk', driver: { '@_name': 'qemu', '@_type': 'vmdk' }, source: { '@_file': d }, target: { '@_dev': sataDev(i), '@_bus': 'sata' } })),
      interface: { '@_type': 'network', source: { '@_network': 'default' }, mac: { '@_address': g.mac }, model: { '@_type': 'e1000' } },
    },
  } });
  const file = path.join(dir, 'source-domain.xml');
  await fs.writeFile(file, xml);
  return file;
}

async function ferry(g: DebianGuest, dir: string): Promise<Run> {
  const out = path.join(dir, 'ferry');
  await fs.mkdir(out);
  if (g.dataVmdk) return ferryOfManifest(g, dir, out);
  // Every guest repair ferry-convert has; remove_source_hv_tools only once the command line accepts it.
  const keys = Object.keys((converterConfigSchema.describe() as { keys?: Record<string, unknown> }).keys || {}); // an object schema's description lists its keys
  const cfg: Record<string, unknown> = {
    command: 'local', vmdk: g.vmdk, output_dir: out, to_output: `ferry-${g.variant}.qcow2`, out_format: 'qcow2',
    fstab_mode: 'stabilize-all', regen_initramfs: true, update_grub: true, virt_test: false,
  };
  const missing = ['remove_source_hv_tools'].filter((k) => !keys.includes(k));
  for (const k of ['remove_source_hv_tools']) if (keys.includes(k)) cfg[k] = true;
  const file = path.join(dir, 'ferry.yaml');
  await fs.writeFile(file, JSON.stringify(cfg, null, 2)); // JSON is YAML
  const r = await measured(process.execPath, [FERRY, '--config', file], process.env);
  await fs.writeFile(path.join(dir, 'ferry.log'), r.log);
  const outputs = [path.join(out, `ferry-${g.variant}.qcow2`)];
  return { ...await ferryRun(g, r, outputs, missing.length ? [`no command-line key ${missing.join(', ')}`] : []), repairSeconds: await repairSeconds(out) };
}

async function ferryOfManifest(g: DebianGuest, dir: string, out: string): Promise<Run> {
  // With the schema's defaults filled in, as ferry-convert reads it: outputNames below needs them.
  const m = validateManifest(await repairManifest(g, out, `ferry-${g.variant}.qcow2`, 'bench'));
  const file = path.join(dir, 'ferry-manifest.json');
  await fs.writeFile(file, JSON.stringify(m, null, 2));
  const r = await measured(process.execPath, [FERRY, '--manifest', file], process.env);
  await fs.writeFile(path.join(dir, 'ferry.log'), r.log);
  return { ...await ferryRun(g, r, [...outputNames(m, out).values()], []), repairSeconds: await repairSeconds(out) };
}

async function ferryRun(g: DebianGuest, r: { code: number | null; seconds: number; peakMiB: number; log: string }, outputs: string[], notes: string[]): Promise<Run> {
  const outBytes = await allocated(outputs);
  const ok = r.code === 0 && outBytes !== undefined;
  if (!ok) notes.push(`exit ${r.code}: ${r.log.trim().split('\n').slice(-3).join(' | ')}`);
  return { tool: 'ferry', variant: g.variant, ok, seconds: r.seconds, peakMiB: r.peakMiB, outputs: outBytes !== undefined ? outputs : undefined, outBytes, note: notes.join('; ') || undefined };
}

/** The converter wrote no output file: the run counts as failed (ok is false below). */
const noOutput = (): undefined => undefined;
const mmss = (s: number) => `${Math.floor(s / 60)}:${String(Math.round(s % 60)).padStart(2, '0')}`;

async function main() {
  const variants = (process.env.BENCH_VARIANTS?.split(',') || [...DEBIAN_VARIANTS]) as DebianVariant[];
  const unknown = variants.filter((v) => !(DEBIAN_VARIANTS as readonly string[]).includes(v));
  if (unknown.length) {
    console.error(`BENCH_VARIANTS: unknown variant ${unknown.join(', ')} (the variants: ${DEBIAN_VARIANTS.join(', ')})`);
    process.exit(2);
  }
  const base = await fs.mkdtemp(path.join(process.env.BENCH_DIR || os.tmpdir(), 'ferry-bench-guest-'));
  console.log(`guest benchmark: Debian guest fixtures (${variants.join(', ')}), ${os.cpus().length} CPUs, load ${os.loadavg()[0].toFixed(1)}, work dir ${base}`);
  const runs: Run[] = [];
  for (const v of variants) {
    const g = await ensureDebianGuest(v);
    const dir = path.join(base, v);
    await fs.mkdir(dir);
    for (const tool of [virtV2v, ferry]) {
      const r = await tool(g, dir);
      if (r.outputs) {
        const b = await bootsOnVirtio(g, r.outputs, 'qcow2', path.join(dir, `${r.tool}-boot.log`));
        r.boots = b.boots;
        r.boot = b.detail;
      } else { r.boots = false; r.boot = 'no output'; }
      runs.push(r);
      console.log(`${v} ${r.tool}: ${r.ok ? 'ok' : 'FAILED'} in ${mmss(r.seconds)}${r.repairSeconds !== undefined ? ` (repair stage ${r.repairSeconds.toFixed(1)} s)` : ''}, peak ${r.peakMiB.toFixed(0)} MiB, output ${r.outBytes !== undefined ? `${(r.outBytes / 1048576).toFixed(0)} MiB` : '-'}, boots on virtio: ${r.boots ? 'yes' : 'no'} (${r.boot})${r.note ? `; ${r.note}` : ''}`);
    }
  }
  console.log('\n| variant | tool | wall | peak memory (tree) | output size | boots on virtio-blk | note |');
  console.log('|---|---|---|---|---|---|---|');
  for (const r of runs) {
    console.log(`| ${r.variant} | ${r.tool} | ${mmss(r.seconds)} | ${r.peakMiB.toFixed(0)} MiB | ${r.outBytes !== undefined ? `${(r.outBytes / 1048576).toFixed(0)} MiB` : '-'} | ${r.boots ? 'yes' : 'no'}: ${r.boot} | ${r.ok ? '' : 'run failed; '}${r.note || ''} |`);
  }
  let met = true;
  for (const v of variants) {
    const f = runs.find((r) => r.variant === v && r.tool === 'ferry')!;
    const b = runs.find((r) => r.variant === v && r.tool === 'virt-v2v')!;
    const boots = f.ok && !!f.boots;
    const repairMet = f.repairSeconds !== undefined && f.repairSeconds <= REPAIR_TARGET;
    met = met && repairMet;
    console.log(`${v}: Ferry's repair stage ${f.repairSeconds?.toFixed(1) ?? '(no report)'} s (target <= ${REPAIR_TARGET}): ${repairMet ? 'met' : 'NOT met'}`);
    // A virt-v2v that refused the guest made no output: its wall time is how fast it refused, nothing to race.
    if (!b.ok) {
      met = met && boots;
      console.log(`${v}: Ferry ${boots ? 'boots' : 'does NOT boot'} on virtio; virt-v2v made no output (${b.note}), so no wall-time ratio`);
      continue;
    }
    const ratio = f.seconds / b.seconds;
    met = met && boots && ratio <= RATIO_TARGET;
    console.log(`${v}: Ferry ${boots ? 'boots' : 'does NOT boot'} on virtio; Ferry wall ${ratio.toFixed(2)}x virt-v2v's (target <= ${RATIO_TARGET.toFixed(2)})`);
  }
  console.log(`targets (Ferry boots on every variant, repair stage <= ${REPAIR_TARGET} s, wall <= ${RATIO_TARGET}x virt-v2v): ${met ? 'MET' : 'NOT MET'} (load now ${os.loadavg()[0].toFixed(1)})`);
  console.log(`outputs and logs kept in ${base}`);
}

main().catch((e) => { console.error(e); process.exit(1); });
