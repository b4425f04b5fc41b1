// Request schemas of the virtualization-host API (/virt/*), /convert/vm and /import/kvm: validation, types and
// OpenAPI from one place. Names follow libvirt's rules (domain/libvirt/names.ts); sizes are bytes unless the
// field says MiB.
import Joi from 'joi';
import { absolutePath, OUTPUT_FORMATS, DISK_FORMATS } from './common';
import { domainName, macAddress, virtName } from '../libvirt/names';
import { VOLUME_FORMATS, WIPE_ALGORITHMS } from '../libvirt/volumes';
import type { NetworkSpec } from '../libvirt/networks';
import type { CloneSpec } from '../libvirt/clone';
import type { Customize } from '../libvirt/templates';

// What each request schema gives a handler once validated (defaults filled in).
export interface NameInput { name: string }
export interface VolumeRef { pool: string; volume: string }
export interface BatchDomains { domains: string[] }

const name = virtName.required();
// A domain the request creates: also never a name virsh could read as an ID or a UUID (names.ts confusableName).
const newDomain = domainName.required();
const domains = Joi.array().items(Joi.string().max(200)).min(1).max(1000).required()
  .description('domain names; each is validated on its own, a bad one fails alone');

export const virtSuccessSchema = Joi.object({
  status: Joi.string().valid('success'), message: Joi.string(), data: Joi.any(), timestamp: Joi.string().isoDate(),
}).label('VirtSuccess');

export const nameQuery = Joi.object<NameInput>({ name });
export const volumeQuery = Joi.object<VolumeRef>({ pool: name, volume: name });
export const nameBody = Joi.object<NameInput>({ name });
export const domainStartBody = Joi.object<NameInput & { paused: boolean }>({ name, paused: Joi.boolean().default(false) });
export const snapshotBody = Joi.object<{ domain_name: string; snapshot_name: string; description?: string }>({
  domain_name: name, snapshot_name: name, description: Joi.string().max(4096).allow(''),
});
export const networkCreateBody = Joi.object<NetworkSpec>({
  name, bridge: Joi.string().pattern(/^[A-Za-z0-9_.-]{1,15}$/).description('Linux bridge name, at most 15 characters'),
  forward: Joi.string().valid('nat', 'route', 'none').default('none').description('nat, route, or none (an isolated network)'),
  subnet: Joi.string().max(64).description('IPv4 network in CIDR form, for example 192.168.150.0/24; the gateway is its first address'),
  ip_start: Joi.string().max(64), ip_end: Joi.string().max(64),
});
export const interfaceAttachBody = Joi.object<{ vm_name: string; network: string; model: string }>({
  vm_name: name, network: name, model: Joi.string().valid('virtio', 'e1000', 'e1000e', 'rtl8139').default('virtio'),
});
export const interfaceDetachBody = Joi.object<{ vm_name: string; mac: string }>({ vm_name: name, mac: macAddress.required() });
export const volumeCreateBody = Joi.object<{ pool: string; name: string; format: string; capacity: number; prealloc: boolean }>({
  pool: name, name, format: Joi.string().valid(...VOLUME_FORMATS).default('qcow2'),
  capacity: Joi.number().integer().min(1).max(2 ** 53).required().description('bytes'), prealloc: Joi.boolean().default(false),
});
export const volumeCloneBody = Joi.object<{ pool: string; source_volume: string; target_volume: string; target_pool?: string }>({
  pool: name, source_volume: name, target_volume: name, target_pool: virtName,
});
export const volumeResizeBody = Joi.object<VolumeRef & { capacity: number; shrink: boolean }>({
  pool: name, volume: name, capacity: Joi.number().integer().min(1).max(2 ** 53).required().description('bytes (new total)'),
  shrink: Joi.boolean().default(false),
});
export const volumeBody = Joi.object<VolumeRef>({ pool: name, volume: name });
export const volumeUploadBody = Joi.object<VolumeRef & { source_path: string; format?: string }>({
  pool: name, volume: name, source_path: absolutePath.required(),
  format: Joi.string().valid(...VOLUME_FORMATS).description('volume format; the source is converted when it differs'),
});
export const volumeWipeBody = Joi.object<VolumeRef & { algorithm: string }>({
  pool: name, volume: name, algorithm: Joi.string().valid(...WIPE_ALGORITHMS).default('zero'),
});

export const batchStartBody = Joi.object<BatchDomains & { paused: boolean }>({ domains, paused: Joi.boolean().default(false) });
export const batchStopBody = Joi.object<BatchDomains & { force: boolean; timeout: number; force_after_timeout: boolean }>({
  domains, force: Joi.boolean().default(false).description('true: virsh destroy at once; false: virsh shutdown, then wait for the domain to be shut off'),
  timeout: Joi.number().integer().min(0).max(3600).default(60).description('seconds a graceful stop waits for the guest to shut down'),
  force_after_timeout: Joi.boolean().default(false).description('destroy a domain still running after `timeout` (else it fails and is left running)'),
});
export const batchRebootBody = Joi.object<BatchDomains & { force: boolean }>({
  domains, force: Joi.boolean().default(false).description('true: virsh reset; false: virsh reboot, a request the guest may ignore'),
});
export const batchSnapshotBody = Joi.object<BatchDomains & { name_prefix: string; description?: string; atomic: boolean; disk_only: boolean }>({
  domains, name_prefix: virtName.default('snap'), description: Joi.string().max(4096).allow(''),
  atomic: Joi.boolean().default(false), disk_only: Joi.boolean().default(false),
});
export const batchDeleteBody = Joi.object<BatchDomains & { remove_storage: boolean; snapshots_only: boolean }>({
  domains, remove_storage: Joi.boolean().default(false), snapshots_only: Joi.boolean().default(false),
});
export const batchDomainsBody = Joi.object<BatchDomains>({ domains });

export const cloneBody = Joi.object<CloneSpec>({
  source: name, target: newDomain, files: Joi.array().items(absolutePath).max(26), new_mac: Joi.boolean().default(true),
  auto_clone: Joi.boolean().default(true), preserve: Joi.boolean().default(false),
});
export const cloneMultipleBody = Joi.object<{ source: string; name_prefix: string; count: number; start_index: number }>({
  source: name, name_prefix: virtName.required(), count: Joi.number().integer().min(1).max(100).required(),
  start_index: Joi.number().integer().min(0).max(1_000_000).default(1),
});
export const templateCreateBody = Joi.object<{ domain: string; name?: string; description?: string; metadata?: Record<string, string>; seal: boolean }>({
  domain: name, name: virtName, description: Joi.string().max(4096).allow(''),
  metadata: Joi.object().pattern(Joi.string().pattern(/^[A-Za-z_][A-Za-z0-9_.-]{0,63}$/), Joi.string().max(4096).allow('')).max(64),
  seal: Joi.boolean().default(false),
});
export const customizeSchema = Joi.object<Customize>({
  hostname: Joi.string().hostname().max(253),
  root_password_hash: Joi.string().pattern(/^\$[0-9a-z]+\$[A-Za-z0-9./$=,]+$/).max(512).description('crypt(3) hash, for example from `openssl passwd -6`; plaintext passwords are not taken'),
  ssh_keys: Joi.array().items(Joi.string().pattern(/^(ssh-|ecdsa-|sk-)[A-Za-z0-9@.-]+ [A-Za-z0-9+/=]+( [^\n\r]*)?$/).max(16384)).max(32).description('public keys, one line each'),
  ssh_user: Joi.string().pattern(/^[a-z_][a-z0-9_-]{0,31}$/).default('root'),
  first_boot_command: Joi.string().max(4096).pattern(/^[^\n\r]+$/).description('run once by the guest at its first boot'),
});
export const templateDeployBody = Joi.object<{
  template: string; name: string; memory?: number; vcpus?: number; network?: string; autostart: boolean; customize?: Customize;
}>({
  template: name, name: newDomain, memory: Joi.number().integer().min(16).max(16 * 1024 * 1024).description('MiB'),
  vcpus: Joi.number().integer().min(1).max(512),
  network: virtName, autostart: Joi.boolean().default(false), customize: customizeSchema,
});
export const templateExportBody = Joi.object<{ template: string; export_path: string; compress: boolean; security_info: boolean }>({
  template: name, export_path: absolutePath.required(), compress: Joi.boolean().default(false),
  security_info: Joi.boolean().default(false).description('domain.xml with its VNC/SPICE passwords (virsh dumpxml --security-info); off unless asked'),
});

export interface ConvertVmInput {
  source_path: string; source_format?: string; dest_path: string; format: string; compression: 'none' | 'zlib'; overwrite: boolean;
}
export const convertVmBody = Joi.object<ConvertVmInput>({
  source_path: absolutePath.required(),
  source_format: Joi.string().valid(...DISK_FORMATS).description('must match the image header (read by Ferry); taken from it when absent'),
  dest_path: absolutePath.required(), format: Joi.string().valid(...OUTPUT_FORMATS).default('qcow2'),
  compression: Joi.string().valid('none', 'zlib').default('none').description('zlib: qcow2 compressed clusters (qemu-img convert -c)'),
  overwrite: Joi.boolean().default(false),
});
export interface ImportKvmInput {
  image_path: string; vm_name: string; memory: number; cpus: number; network?: string; pool?: string; firmware: 'bios' | 'uefi';
}
export const importKvmBody = Joi.object<ImportKvmInput>({
  image_path: absolutePath.required(), vm_name: newDomain,
  memory: Joi.number().integer().min(16).max(16 * 1024 * 1024).default(1024).description('MiB'),
  cpus: Joi.number().integer().min(1).max(512).default(1),
  network: virtName.description('libvirt network, or a host bridge when no network has this name; none when absent'),
  pool: virtName.description('storage pool; default FERRY_LIBVIRT_POOL ("ferry"), created on first use'),
  firmware: Joi.string().valid('bios', 'uefi').default('bios'),
});
