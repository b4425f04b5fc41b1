// Choices a job makes about its source VM (no imports: the schemas use them without loading the client).
export const POWER_OPTIONS = ['none', 'shutdown', 'force'] as const;
export type PowerOption = (typeof POWER_OPTIONS)[number];
