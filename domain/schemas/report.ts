// report.json: what a pipeline run did. The seed names only the file; this shape is ours, documented as JSON
// Schema in docs/report-schema.json, generated from this joi schema with platform/openapi.ts toJsonSchema.
import Joi from 'joi';

const stageReport = Joi.object({
  enabled: Joi.boolean().required(),
  success: Joi.boolean().allow(null).required().description('null when the stage did not run'),
  started_at: Joi.string().isoDate(),
  duration_seconds: Joi.number().min(0),
  result: Joi.object().unknown(true),
  error: Joi.string(),
  skipped_reason: Joi.string(),
});

export const reportSchema = Joi.object({
  report_version: Joi.string().valid('1.0').required(),
  manifest_version: Joi.string().required(),
  tool: Joi.string().required(),
  started_at: Joi.string().isoDate().required(),
  finished_at: Joi.string().isoDate().required(),
  duration_seconds: Joi.number().min(0).required(),
  dry_run: Joi.boolean().required(),
  success: Joi.boolean().required(),
  retryable: Joi.boolean().description(
    'only when success is false: whether every failure may pass when tried again (a hung or crashed appliance launch, not a broken guest); a migration job ' +
    'is retried on it while its retry_count allows'),
  failures: Joi.array().items(Joi.object({
    message: Joi.string().required(),
    retryable: Joi.boolean().required(),
    fault: Joi.string().valid('guest', 'appliance', 'host').description('the converter\'s typed errors: whose fault it was (a guest fault is never retried)'),
    step: Joi.string().description('the converter step that failed (`ferry-convert --explain` lists them)'),
  })).description('only when success is false: each failure of `errors` with its kind'),
  source: Joi.object().unknown(true),
  stages: Joi.object({ inspect: stageReport, convert: stageReport, fix: stageReport, validate: stageReport }).required(),
  artifacts: Joi.array().items(Joi.object({
    disk_id: Joi.string().required(),
    path: Joi.string().required(),
    format: Joi.string().required(),
    boot_order: Joi.number().integer().required(),
    source_path: Joi.string().required(),
    source_format: Joi.string().required(),
    source_sha256: Joi.string(),
    virtual_size: Joi.number().integer(),
    file_size: Joi.number().integer(),
    actual_size: Joi.number().integer(),
    sha256: Joi.string(),
    compressed: Joi.boolean(),
    modified_by_fix: Joi.boolean(),
  }).unknown(true)).required(),
  firmware: Joi.object({
    firmware: Joi.string().valid('bios', 'uefi').required(),
    reason: Joi.string().required(),
  }).description(
    'the firmware the outputs need on KVM (the import and the test boot give it) and why: the guest\'s boot loaders, else the manifest\'s vm.firmware'),
  test_boot: Joi.object({
    status: Joi.string().valid('passed', 'failed', 'inconclusive').required(),
    detail: Joi.string().required(),
    seconds: Joi.number().min(0).required(),
    accelerator: Joi.string().valid('kvm', 'tcg').required(),
    matched: Joi.string(),
    console_tail: Joi.string().allow('').required().description('the last 2,000 printable characters of the serial console'),
    console_log: Joi.string().description('the whole serial console, kept beside the outputs'),
    firmware: Joi.string().valid('bios', 'uefi').required().description('the firmware the test boot used'),
  }).description('virt_test: one boot of the outputs with qemu (snapshot=on, nothing written to them)'),
  warnings: Joi.array().items(Joi.string()).required(),
  errors: Joi.array().items(Joi.string()).required(),
  summary: Joi.object({
    disks: Joi.number().integer(),
    stages_run: Joi.array().items(Joi.string()),
    stages_failed: Joi.array().items(Joi.string()),
    total_source_bytes: Joi.number().integer(),
    total_output_bytes: Joi.number().integer(),
    message: Joi.string(),
  }).unknown(true).required(),
}).label('Report');
