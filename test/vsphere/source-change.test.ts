// What the export's source watch calls a change (domain/vsphere/source-watch.ts sourceChange), reading by
// reading: the cases the simulator cannot make mid-export in a test (a disk grown, added or removed, a revert)
// beside those it can (test/plans/options.test.ts takes a snapshot and powers the VM on mid-export).
import { expect } from 'chai';
import { sourceChange, type SourceFingerprint } from '../../domain/vsphere/source-watch';

const was: SourceFingerprint = { power_state: 'poweredOff', snapshots: ['1'], current_snapshot: '1', disks: { 'Hard disk 1': 1 << 30, 'Hard disk 2': 2 << 30 } };
const change = (now: Partial<SourceFingerprint>) => sourceChange(was, { ...was, ...now });

describe('the source watch: what counts as a changed source', () => {
  it('the same reading is no change; a guest-side change vSphere does not show is not one either', () => {
    expect(change({})).to.equal(null);
    expect(change({ snapshots: ['1'] })).to.equal(null);
  });

  it('names each change: powered on, snapshots taken or removed, a revert, a disk grown, added or removed', () => {
    expect(change({ power_state: 'poweredOn' })).to.equal('it was powered on (poweredOff -> poweredOn)');
    expect(change({ snapshots: ['1', '2'], current_snapshot: '2' })).to.equal('1 new snapshot(s) were taken');
    expect(change({ snapshots: [], current_snapshot: null })).to.equal('1 snapshot(s) were removed');
    expect(change({ current_snapshot: '0' })).to.equal('it was reverted to another snapshot');
    expect(change({ disks: { ...was.disks, 'Hard disk 1': 2 << 30 } })).to.equal(`Hard disk 1 changed size (${1 << 30} -> ${2 << 30} bytes)`);
    expect(change({ disks: { ...was.disks, 'Hard disk 3': 1 } })).to.equal('Hard disk 3 was added');
    expect(change({ disks: { 'Hard disk 1': 1 << 30 } })).to.equal('Hard disk 2 was removed');
  });

  it('several changes at once are all named', () => {
    expect(change({ power_state: 'poweredOn', disks: { 'Hard disk 1': 1 << 30 } })).to.equal('it was powered on (poweredOff -> poweredOn); Hard disk 2 was removed');
  });
});
