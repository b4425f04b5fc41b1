// The libvirt layer (docs/virt.md): one import for the daemon, workers and virt_test.
export * from './virsh';
export * from './names';
export * from './xml';
export * from './domains';
export * from './networks';
export * from './volumes';
export * from './stats';
export * from './batch';
export * from './clone';
export * from './templates';
export * from './import';
export * from './console';
export * from './boot';
export * from './paths';
