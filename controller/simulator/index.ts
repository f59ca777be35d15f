export { Random } from "./random.ts";
export { MIXES, workload, type JobShape, type JobSpec, type Mix, type Workload } from "./workload.ts";
export { bestFit, firstFree, randomFree, scheduler, SCHEDULERS, type Scheduler, type SchedulerName } from "./scheduler.ts";
export { constrain, type Constraints } from "./constrain.ts";
export { trace, TraceOptionsSchema, type TraceOptions, type TraceSummary } from "./trace.ts";
export { maxMinRates, type MaxMinProblem } from "./maxmin.ts";
export { MODELS, DEFAULT_TOKENS_PER_REPLICA, MAX_TOKENS_PER_REPLICA, iterationCost, type ModelSpec, type IterationCost, type Parallelism } from "./models.ts";
export {
  generateJobs,
  isPublishedMix,
  SIM_MIXES,
  type SimMix,
  idealRates,
  iterationSeconds,
  type IterationRates,
  parseSimJobs,
  SimJobSchema,
  MAX_TRACE_JOBS,
  MAX_TRACE_SECONDS,
  tooManyJobs,
  GenerateOptionsSchema,
  TraceGenerationSchema,
  type SimJob,
  type GenerateOptions,
  type TraceGeneration,
} from "./jobs.ts";
export { bytesPerSecond, Fabric, FabricSchema, fabricKind, fabricSummary, type FabricShape, type FabricKind } from "./fabric.ts";
export { ROUTINGS, choosePaths, ecmpSpine, sourcePort, type RoutingName } from "./routing.ts";
export {
  simulateSystem,
  systemSpec,
  SimConfigSchema,
  FREE_PLAN_TIME_LIMIT_MS,
  QUEUES,
  SYSTEMS,
  SYSTEMS_2TIER,
  type SimConfig,
  type SimConfigInput,
  type QueueName,
  type SystemName,
  type SystemRun,
  type JobOutcome,
  type PlanEvent,
  type FragmentationSample,
  type SimObserver,
} from "./simulate.ts";
export {
  simulationReport,
  systemReport,
  moveEvents,
  pooledMoveEvents,
  SimulationReportSchema,
  SystemReportSchema,
  type SimulationReport,
  type SystemReport,
} from "./report.ts";
export { HEADLINES, type Headline } from "./headlines.ts";
export { applyVariant, PRESETS, presetConfig, presetGeneration, sweptSettings, VariantSchema, type Preset, type PresetName, type Variant } from "./presets.ts";
export { sacctToTrace, MAX_SACCT_JOBS, type SacctOptions, type SacctConversion } from "./sacct.ts";
