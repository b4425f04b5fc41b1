// The record of a fixture's source boot (test/fixtures/source-proof.ts) stands in for a boot only while it is true:
// a record is written only when its checks pass, re-checked with the caller's assertions on every use, removed and
// booted again when they fail, and not used at all once the disk or the boot options change. Shown on the tiny guest
// (its boot code prints the marker in about a second under TCG), copied into a temporary fixture directory.
import { expect } from 'chai';
import { copyFileSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DebianGuest, DebianVariant } from '../fixtures/debian-guest';
import { asOnVmware, provedSourceBoot } from '../fixtures/source-proof';
import { ensureTinyGuest, TINY_GUEST_MARKER } from '../fixtures/tiny-guest';
import type { TestBootResult } from '../../domain/converter/testboot';

/** A record file as test/fixtures/source-proof.ts writes it (its SourceBootRecord, not exported). */
interface SourceBootRecord { result: TestBootResult; console: string; at: string }

describe('source boots of a cached fixture: booted once, their record re-checked @vm', function () {
  this.timeout(300_000); // the tiny guest's first build is one appliance launch
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ferry-proof-test-'));
  after(() => rmSync(dir, { recursive: true, force: true }));
  let g: DebianGuest;
  const records = () => readdirSync(dir).filter((f) => f.startsWith('proof-'));
  const marker = new RegExp(TINY_GUEST_MARKER);

  before(async () => {
    const vmdk = path.join(dir, 'disk.vmdk');
    copyFileSync(await ensureTinyGuest(), vmdk);
    g = { variant: 'tiny' as DebianVariant, vmdk, marker: TINY_GUEST_MARKER, ready: marker, address: '', vmwareNic: 'ens192', vmwareNicSlot: 192,
      mac: '00:50:56:9f:12:01', rootDevice: '/dev/sda1', firstbootLog: '' };
  });

  it('boots and records when there is no record; the next use checks the record without booting', async () => {
    const seen: string[] = [];
    const check = (r: { status: string }, text: string) => { seen.push(r.status); expect(r.status).to.equal('passed'); expect(text).to.contain(TINY_GUEST_MARKER); };
    expect(await provedSourceBoot(g, 'sata', asOnVmware(g, marker, { timeoutSeconds: 120 }), check)).to.equal('booted');
    expect(records()).to.have.length(1);
    const record = JSON.parse(readFileSync(path.join(dir, records()[0]), 'utf8')) as SourceBootRecord;
    expect(record.result.status).to.equal('passed');
    expect(record.console).to.contain(TINY_GUEST_MARKER);
    expect(await provedSourceBoot(g, 'sata', asOnVmware(g, marker, { timeoutSeconds: 120 }), check)).to.equal('recorded');
    expect(seen).to.deep.equal(['passed', 'passed']);
  });

  it('a check the record fails removes it and boots again; a boot that fails its check leaves no record', async () => {
    const opts = asOnVmware(g, marker, { timeoutSeconds: 120 });
    // Asks for what the console never shows: the record fails, the new boot fails too, nothing is kept.
    const impossible = (_r: unknown, text: string) => { expect(text).to.contain('NEVER-ON-THIS-CONSOLE'); };
    let thrown: Error | undefined;
    await provedSourceBoot(g, 'sata', opts, impossible).catch((e: Error) => { thrown = e; });
    expect(thrown?.message).to.contain('NEVER-ON-THIS-CONSOLE');
    expect(records()).to.deep.equal([]);
    rmSync(path.resolve(__dirname, '..', 'artifacts', 'guest-tiny-sata.log'), { force: true }); // the kept serial log of this expected failure
  });

  it('a changed disk (its modification time) or changed boot options are booted again, not read from an old record', async () => {
    const check = (r: { status: string }) => { expect(r.status).to.equal('passed'); };
    expect(await provedSourceBoot(g, 'sata', asOnVmware(g, marker, { timeoutSeconds: 120 }), check)).to.equal('booted');
    expect(await provedSourceBoot(g, 'sata', asOnVmware(g, marker, { timeoutSeconds: 121 }), check)).to.equal('booted');
    const later = new Date(Date.now() + 60_000);
    utimesSync(g.vmdk, later, later);
    expect(await provedSourceBoot(g, 'sata', asOnVmware(g, marker, { timeoutSeconds: 120 }), check)).to.equal('booted');
    expect(await provedSourceBoot(g, 'sata', asOnVmware(g, marker, { timeoutSeconds: 120 }), check)).to.equal('recorded');
  });
});
