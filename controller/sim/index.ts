export { Random } from "./random.ts";
export { MIXES, workload, type JobShape, type JobSpec, type Mix, type Workload } from "./workload.ts";
export { bestFit } from "./scheduler.ts";
export { trace, TraceOptionsSchema, type TraceOptions, type TraceSummary } from "./trace.ts";
