// The layout of the job statistics hash (`<prefix>:stats`): written by moveIndexes.lua, which gets these generated
// into its "rules" include (queue/scripts.ts), and read at scrape time by queue/metrics.ts. Its own module so that
// the script loader and the metrics, which the store and the registry both reach, need not import each other.

/** The run-time histogram's bucket bounds (seconds). */
export const DURATION_BUCKETS = [60, 300, 600];

/** The statistics hash's field names: `<total><outcome>`, `<durationIn><le>:<outcome>`, `<durationSum>`. */
export const STAT_FIELDS = { total: 'total:', durationIn: 'duration_in:', durationSum: 'duration_sum' } as const;
