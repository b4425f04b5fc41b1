// The fstab rewrite as a pure function: every mode, every kind of spec, spacing kept.
import { expect } from 'chai';
import { classifySpec, resolveSpec, rewriteFstab, rewriteKernelArgs, FstabContext } from '../../domain/converter/fstab';
import { substituteEnv, validateBatch, validateConfig, ConfigError } from '../../domain/schemas/converter-config';

const ctx: FstabContext = {
  disks: ['/dev/sda', '/dev/sdb'],
  ids: {
    '/dev/sda1': { uuid: 'u-root', partuuid: 'p-1', label: 'rootfs' },
    '/dev/sda2': { uuid: 'u-swap', partuuid: 'p-2' },
    '/dev/sdb1': { partuuid: 'p-b1', label: 'data' },
    '/dev/sdb2': { label: 'only-label' },
  },
  rootDevice: '/dev/sda1',
};
const FSTAB = [
  '# comment /dev/sda1 / ext4',
  '/dev/sda1    /       ext4  defaults 0 1',
  '\t/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:0:0-part2  none swap sw 0 0',
  '/dev/disk/by-id/wwn-0x5000c29-part1 /data ext4 defaults 0 2',
  '/dev/sdb1 /srv xfs defaults 0 2',
  '/dev/sdb2 /opt ext4 defaults 0 2',
  'proc /proc proc defaults 0 0',
  'tmpfs /tmp tmpfs defaults 0 0',
  'UUID=keep /keep ext4 defaults 0 2',
  '/dev/mapper/vg-root /var ext4 defaults 0 2',
  'server:/export /mnt nfs defaults 0 0',
  '',
].join('\n');

describe('fstab rewrite (pure)', () => {
  it('classifies specs', () => {
    expect(classifySpec('/dev/sda1')).to.equal('kernel-name');
    expect(classifySpec('/dev/vdb')).to.equal('kernel-name');
    expect(classifySpec('/dev/nvme0n1p2')).to.equal('kernel-name');
    expect(classifySpec('/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:0:0-part1')).to.equal('by-path');
    expect(classifySpec('/dev/disk/by-id/ata-X-part1')).to.equal('by-id');
    expect(classifySpec('UUID=x')).to.equal('stable');
    expect(classifySpec('/dev/disk/by-uuid/x')).to.equal('stable');
    expect(classifySpec('proc', 'proc')).to.equal('pseudo');
    expect(classifySpec('/dev/sda1', 'tmpfs')).to.equal('pseudo');
    expect(classifySpec('/dev/mapper/vg-root')).to.equal('other');
  });
  it('resolves kernel names by disk order and by-path by SCSI target', () => {
    expect(resolveSpec('/dev/sdb1', ctx)).to.equal('/dev/sdb1');
    expect(resolveSpec('/dev/vda2', ctx)).to.equal('/dev/sda2');
    expect(resolveSpec('/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:1:0-part1', ctx)).to.equal('/dev/sdb1');
    expect(resolveSpec('/dev/sdz1', ctx)).to.equal(undefined);
    expect(resolveSpec('/dev/sdz1', ctx, '/')).to.equal('/dev/sda1');
    expect(resolveSpec('/dev/disk/by-id/scsi-36000-part1', { ...ctx, disks: ['/dev/sda'] })).to.equal('/dev/sda1');
  });
  it('stabilize-all: UUID, then PARTUUID, then LABEL; stable, pseudo and network entries untouched; spacing kept', () => {
    const r = rewriteFstab(FSTAB, 'stabilize-all', ctx);
    const lines = r.text.split('\n');
    expect(lines[0]).to.equal('# comment /dev/sda1 / ext4');
    expect(lines[1]).to.equal('UUID=u-root    /       ext4  defaults 0 1');
    expect(lines[2]).to.equal('\tUUID=u-swap  none swap sw 0 0');
    expect(lines[3]).to.equal(FSTAB.split('\n')[3]); // by-id, two disks: cannot tell which
    expect(lines[4]).to.equal('PARTUUID=p-b1 /srv xfs defaults 0 2');
    expect(lines[5]).to.equal('LABEL=only-label /opt ext4 defaults 0 2');
    expect(lines.slice(6)).to.deep.equal(FSTAB.split('\n').slice(6));
    expect(r.changes.map((c) => c.line)).to.deep.equal([2, 3, 5, 6]);
    expect(r.warnings).to.have.length(1);
    expect(r.warnings[0]).to.match(/line 4: cannot tell which device \/dev\/disk\/by-id/);
  });
  it('bypath-only touches only /dev/disk/by-path entries', () => {
    const r = rewriteFstab(FSTAB, 'bypath-only', ctx);
    expect(r.changes.map((c) => c.from)).to.deep.equal(['/dev/disk/by-path/pci-0000:00:10.0-scsi-0:0:0:0-part2']);
    expect(r.text.split('\n')[1]).to.equal('/dev/sda1    /       ext4  defaults 0 1');
  });
  it('uuid-only writes UUID= or leaves the entry with a warning', () => {
    const r = rewriteFstab(FSTAB, 'uuid-only', ctx);
    expect(r.changes.map((c) => c.to)).to.deep.equal(['UUID=u-root', 'UUID=u-swap']);
    expect(r.warnings.filter((w) => /has no UUID/.test(w))).to.have.length(2);
  });
  it('noop and preserve change nothing', () => {
    for (const mode of ['noop', 'preserve'] as const) {
      const r = rewriteFstab(FSTAB, mode, ctx);
      expect(r.text).to.equal(FSTAB);
      expect(r.changes).to.deep.equal([]);
    }
  });
  it('is idempotent: a second pass changes nothing', () => {
    const once = rewriteFstab(FSTAB, 'stabilize-all', ctx).text;
    expect(rewriteFstab(once, 'stabilize-all', ctx).changes).to.deep.equal([]);
  });
  it('rewrites root= and resume= kernel arguments to UUID=', () => {
    const r = rewriteKernelArgs('linux /vmlinuz root=/dev/sda1 ro resume=/dev/sda2 quiet\nlinux /v root=UUID=x', 'stabilize-all', ctx);
    expect(r.text).to.equal('linux /vmlinuz root=UUID=u-root ro resume=UUID=u-swap quiet\nlinux /v root=UUID=x');
    expect(rewriteKernelArgs('root=/dev/sda1', 'noop', ctx).text).to.equal('root=/dev/sda1');
  });
});

describe('converter configuration file', () => {
  const local = { command: 'local', vmdk: 'a.vmdk', output_dir: '/out', to_output: 'a.qcow2' };
  const paths = (doc: unknown) => { try { validateConfig(doc, {}); } catch (e) { return (e as ConfigError).problems.map((p) => p.path); } throw new Error('accepted'); };
  it('accepts mode local with its basic keys and fills defaults', () => {
    expect(validateConfig(local, {})).to.include({ log_level: 'INFO', timeout: 3600, network_retry: 2, batch_parallel: 1, batch_continue_on_error: false });
  });
  it('requires the basic keys per mode and rejects unknown keys and bad values', () => {
    expect(paths({ command: 'local' })).to.deep.equal(['vmdk', 'to_output', 'output_dir']);
    expect(paths({ command: 'fetch-and-fix', output_dir: '/o', to_output: 'x' })).to.deep.equal(['remote', 'host', 'user']);
    expect(paths({ command: 'manager_export' })).to.deep.equal(['vm_name', 'manager_host']);
    expect(paths({ command: 'copy' })).to.deep.equal(['command']);
    expect(paths({ ...local, fstab_mode: 'bypath-only', compression_level: 0, out_format: 'vmdk', windows_version: '2008', bogus: 1 }))
      .to.deep.equal(['out_format', 'compression_level', 'fstab_mode', 'windows_version', 'bogus']);
  });
  it('replaces ${NAME} from the environment; an unset name is an error naming it, never an empty value', () => {
    expect(substituteEnv({ a: 'x-${P}', b: ['${P}'] }, { P: 's3cret' })).to.deep.equal({ a: 'x-s3cret', b: ['s3cret'] });
    expect(() => validateConfig({ ...local, command: 'manager_export', manager_host: 'm', vm_name: 'v', manager_password: '${FERRY_NOPE}' }, {}))
      .to.throw(ConfigError, 'manager_password: environment variable FERRY_NOPE is not set');
    expect(() => substituteEnv({ p: '${E}' }, { E: '' })).to.throw(/E is not set/);
  });
  it('validates batch files', () => {
    expect(validateBatch({ migrations: [{ vmdk: 'a.vmdk', to_output: 'a.qcow2', windows_version: '2019', inject_virtio_drivers: true }] }).migrations).to.have.length(1);
    const bad = (doc: unknown) => { try { validateBatch(doc); } catch (e) { return (e as ConfigError).problems.map((p) => p.path); } throw new Error('accepted'); };
    expect(bad({ migrations: [] })).to.deep.equal(['migrations']);
    expect(bad({ migrations: [{ vmdk: 'a' }, { to_output: 'b' }, { vmdk: 'c', to_output: 'c', nope: 1 }] })).to.deep.equal(['migrations[0].to_output', 'migrations[1]', 'migrations[2].nope']);
  });
});
