// A plan preflight's inspection as the plan runner hands it to a VM's migrate_vm job (parameters.plan.inspection;
// domain/converter/inspection-hint.ts): bounded, and device names only of the shapes libguestfs gives.
import Joi from 'joi';

const device = Joi.string().max(512).pattern(/^(btrfsvol:)?\/dev\/[A-Za-z0-9._+@:/-]+$/).messages({ 'string.pattern.base': '{{#label}} must be a device name such as /dev/sda1' });
const fact = Joi.string().max(256);

export const inspectionHintSchema = Joi.object({
  os: Joi.string().valid('linux').required(),
  distro: fact, version: fact, product_name: fact, hostname: fact,
  package_format: Joi.string().valid('deb', 'rpm', 'apk').required(),
  root: device.required(),
  mountpoints: Joi.object().pattern(Joi.string().max(1024).pattern(/^\//), device).max(64).required(),
  uuids: Joi.object().pattern(Joi.string().max(512).pattern(/^\/dev\//), Joi.string().max(64)).max(64).required(),
  hypervisor_packages: Joi.array().items(Joi.string().max(128)).max(32).required(),
  evidence: Joi.object().pattern(Joi.string().max(256).pattern(/^\//), Joi.string().hex().length(64).allow(null)).max(32).required(),
}).description('the plan preflight\'s inspection of the VM\'s disks, reused by the repair when they are unchanged (set by the plan runner only)');
