// Every manifest rule of the seed: a bad manifest and the exact JSON path of the error.
import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { REPORT_SCHEMA_FILE, reportJsonSchema } from '../../scripts/gen-report-schema';
import { ManifestError, validateManifest, type Manifest } from '../../domain/schemas/manifest';
import { migrateCapabilities } from '../../domain/operations';
import { outputNames } from '../../domain/converter/pipeline';
import { outputPathOf } from '../../services/worker/operations/convert';

const disk = (o: Record<string, unknown> = {}) => ({ id: 'd0', source_format: 'vmdk', bytes: 1024, local_path: '/src/d0.vmdk', ...o });
const base = (o: Record<string, unknown> = {}) => ({ manifest_version: '1.0', disks: [disk()], ...o });

function problems(doc: unknown) {
  try { validateManifest(doc); } catch (e) { expect(e).to.be.instanceOf(ManifestError); return (e as ManifestError).problems; }
  throw new Error('manifest was accepted');
}
const paths = (doc: unknown) => problems(doc).map((p) => p.path);

describe('manifest validation', () => {
  it('accepts the minimal shape and fills every default', () => {
    const m = validateManifest(base({ pipeline: { inspect: { enabled: true }, fix: { enabled: true }, convert: { enabled: true }, validate: { enabled: true } } }));
    expect(m.disks[0]).to.include({ boot_order_hint: 999, disk_type: 'unknown' });
    expect(m.pipeline!.fix).to.deep.equal({ enabled: true, backup: true, print_fstab: false, update_grub: true, regen_initramfs: true, fstab_mode: 'stabilize-all', remove_source_hv_tools: false });
    expect(m.pipeline!.inspect).to.deep.equal({ enabled: true, collect_guest_info: false });
    expect(m.pipeline!.convert).to.deep.equal({ enabled: true, compress: false });
    expect(m.pipeline!.validate).to.deep.equal({ enabled: true, check_image_integrity: true });
    expect(m.output).to.deep.equal({ format: 'qcow2' });
    expect(m.options).to.deep.equal({ dry_run: false, verbose: 1, report: { enabled: true, path: 'report.json' } });
    const vm = validateManifest(base({ vm: {} })).vm!;
    expect(vm).to.deep.equal({ firmware: 'bios', secureboot: false });
  });
  it('accepts unknown properties at the top level and inside every object but pipeline', () => {
    const m = validateManifest(base({ extra: 1, source: { x: 1 }, vm: { y: 2 }, disks: [disk({ z: 3 })], nics: [{ q: 1 }], metadata: { w: 1 }, output: { v: 1 }, options: { u: 1, report: { t: 1 } }, configuration: { users: { a: 1 }, other: 2 }, pipeline: { fix: { enabled: false, custom: 1 } } }));
    expect(m).to.have.property('extra', 1);
    expect(paths(base({ pipeline: { inspect: { enabled: true }, deploy: { enabled: true } } }))).to.deep.equal(['$.pipeline.deploy']);
  });
  it('requires manifest_version and disks', () => {
    expect(paths({})).to.deep.equal(['$.manifest_version', '$.disks']);
  });
  it('allows only manifest_version "1.0"', () => {
    for (const v of ['1.1', '2.0', '1']) expect(paths(base({ manifest_version: v }))).to.deep.equal(['$.manifest_version']);
    expect(new Set(paths(base({ manifest_version: 1.0 })))).to.deep.equal(new Set(['$.manifest_version']));
  });
  it('needs at least one disk', () => expect(paths(base({ disks: [] }))).to.deep.equal(['$.disks']));
  it('requires id, source_format, bytes, local_path on each disk', () => {
    expect(paths(base({ disks: [{}] }))).to.deep.equal(['$.disks[0].id', '$.disks[0].source_format', '$.disks[0].bytes', '$.disks[0].local_path']);
  });
  it('checks the disk id pattern and uniqueness', () => {
    expect(paths(base({ disks: [disk({ id: 'a b' })] }))).to.deep.equal(['$.disks[0].id']);
    const p = problems(base({ disks: [disk(), disk({ local_path: '/src/other.vmdk' })] }));
    expect(p.map((x) => x.path)).to.deep.equal(['$.disks[1].id']);
    expect(p[0].message).to.match(/duplicates disk id "d0"/);
  });
  it('checks source_format, bytes, local_path, checksum, boot_order_hint, disk_type', () => {
    expect(paths(base({ disks: [disk({ source_format: 'ova' })] }))).to.deep.equal(['$.disks[0].source_format']);
    expect(paths(base({ disks: [disk({ bytes: -1 })] }))).to.deep.equal(['$.disks[0].bytes']);
    expect(paths(base({ disks: [disk({ bytes: 1.5 })] }))).to.deep.equal(['$.disks[0].bytes']);
    expect(paths(base({ disks: [disk({ local_path: 'rel/d.vmdk' })] }))).to.deep.equal(['$.disks[0].local_path']);
    expect(paths(base({ disks: [disk({ checksum: 'sha256:' + 'A'.repeat(64) })] }))).to.deep.equal(['$.disks[0].checksum']);
    expect(paths(base({ disks: [disk({ checksum: 'md5:' + 'a'.repeat(32) })] }))).to.deep.equal(['$.disks[0].checksum']);
    expect(() => validateManifest(base({ disks: [disk({ checksum: 'sha256:' + 'a'.repeat(64) })] }))).not.to.throw();
    expect(paths(base({ disks: [disk({ boot_order_hint: -1 })] }))).to.deep.equal(['$.disks[0].boot_order_hint']);
    expect(paths(base({ disks: [disk({ disk_type: 'swap' })] }))).to.deep.equal(['$.disks[0].disk_type']);
  });
  it('checks NIC MAC addresses', () => {
    expect(paths(base({ nics: [{ mac: '00:50:56:aa:bb:cc' }, { mac: '00-50-56-AA-BB-CC' }, { mac: '0050.56aa.bbcc' }] }))).to.deep.equal(['$.nics[2].mac']);
  });
  it('checks vm, warnings, metadata, source timestamps', () => {
    expect(paths(base({ vm: { cpu: 0, mem_gb: 0, firmware: 'efi' } }))).to.deep.equal(['$.vm.cpu', '$.vm.mem_gb', '$.vm.firmware']);
    expect(paths(base({ warnings: [{ message: 'x' }] }))).to.deep.equal(['$.warnings[0].stage']);
    expect(paths(base({ warnings: [{ stage: 'export' }] }))).to.deep.equal(['$.warnings[0].message']);
    expect(paths(base({ metadata: { created_at: 'yesterday', tags: { a: 1 } } }))).to.deep.equal(['$.metadata.created_at', '$.metadata.tags.a']);
    expect(paths(base({ source: { export_timestamp: 'now' } }))).to.deep.equal(['$.source.export_timestamp']);
  });
  it('requires enabled on each stage and checks stage fields', () => {
    expect(paths(base({ pipeline: { inspect: {}, fix: {}, convert: {}, validate: {} } }))).to.deep.equal(['$.pipeline.inspect.enabled', '$.pipeline.fix.enabled', '$.pipeline.convert.enabled', '$.pipeline.validate.enabled']);
    expect(paths(base({ pipeline: { fix: { enabled: true, fstab_mode: 'uuid-only' } } }))).to.deep.equal(['$.pipeline.fix.fstab_mode']);
    expect(paths(base({ pipeline: { convert: { enabled: true, compress_level: 10 } } }))).to.deep.equal(['$.pipeline.convert.compress_level']);
    expect(paths(base({ pipeline: { convert: { enabled: true, compress_level: 0 } } }))).to.deep.equal(['$.pipeline.convert.compress_level']);
    expect(paths(base({ pipeline: { validate: { enabled: 'yes' } } }))).to.deep.equal(['$.pipeline.validate.enabled']);
  });
  it('checks output and options', () => {
    expect(paths(base({ output: { format: 'vmdk', directory: 'out', filename: 'a/b' } }))).to.deep.equal(['$.output.directory', '$.output.format', '$.output.filename']);
    expect(paths(base({ options: { dry_run: 'no', verbose: 4, report: { enabled: 1 } } }))).to.deep.equal(['$.options.dry_run', '$.options.verbose', '$.options.report.enabled']);
  });
  it('reports every problem at once', () => {
    expect(paths({ manifest_version: '9', disks: [{ id: '!', source_format: 'x', bytes: -1, local_path: 'r' }], nics: [{ mac: 'm' }] }))
      .to.deep.equal(['$.manifest_version', '$.disks[0].id', '$.disks[0].source_format', '$.disks[0].bytes', '$.disks[0].local_path', '$.nics[0].mac']);
  });
  it('derives the migrate operation capabilities from the enabled stages', () => {
    expect(migrateCapabilities({ manifest: base() as Manifest })).to.deep.equal(['img_tool']);
    expect(migrateCapabilities({ manifest: base({ pipeline: { convert: { enabled: true }, fix: { enabled: true } } }) as Manifest })).to.deep.equal(['img_tool', 'mount_operations']);
    expect(migrateCapabilities({ manifest: base({ pipeline: { inspect: { enabled: true, collect_guest_info: true } } }) as Manifest })).to.deep.equal(['img_tool', 'mount_operations']);
  });

  it('docs/report-schema.json is the schema report.json is validated with (regenerate: npx tsx scripts/gen-report-schema.ts)', () => {
    expect(readFileSync(REPORT_SCHEMA_FILE, 'utf8')).to.equal(reportJsonSchema());
  });
  it('names outputs with the one extension rule: the format itself, .raw for raw (migrate, convert jobs); a given name is kept', () => {
    const two = (format: string, filename?: string) => [...outputNames(validateManifest(base({ disks: [disk(), disk({ id: 'd1', local_path: '/src/d1.vmdk' })], output: { format, ...(filename ? { filename } : {}) } })), '/out').values()];
    expect(two('raw')).to.deep.equal(['/out/d0.raw', '/out/d1.raw']);
    expect(two('qcow2', 'vm.img')).to.deep.equal(['/out/vm-d0.qcow2', '/out/vm-d1.qcow2']);
    expect([...outputNames(validateManifest(base({ output: { format: 'raw', filename: 'disk.img' } })), '/out').values()]).to.deep.equal(['/out/disk.img']);
    expect(outputPathOf('j1', { output_format: 'raw', output_dir: '/out' })).to.equal('/out/j1.raw');
  });
});
