import { z } from "zod";
import { InvalidInputError } from "../../sdk/contract/errors.ts";
import { MAX_GPUS_PER_HOST, MAX_HOSTS, idSchema } from "../../sdk/contract/protocol/limits.ts";
import { DEFAULT_TOKENS_PER_REPLICA, iterationCost, MAX_TOKENS_PER_REPLICA, MODELS } from "./models.ts";
import { drawPublished, meanGpuSeconds, PUBLISHED_MIXES, publishedJob, type JobType, type PublishedMix } from "./published.ts";
import { Random } from "./random.ts";
import { MIXES, workload } from "./workload.ts";

/**
 * Job mixes of generated traces: the planner's (`MIXES`, sized in hosts, durations drawn in
 * hours, iterations costed from the model table), or the workload the paper's authors
 * published (`published.ts`: `paper`, ten job types on 16–64 GPUs, 100–1,000 iterations each;
 * `paper-dp`, its DP and FSDP types; `paper-ep`, the EP figure's models).
 */
export const SIM_MIXES = [...MIXES, ...(Object.keys(PUBLISHED_MIXES) as PublishedMix[])] as const;
export type SimMix = (typeof SIM_MIXES)[number];

/** Whether `mix` is one the paper's authors published, whose jobs bring their own iterations and costs. */
export const isPublishedMix = (mix: SimMix): mix is PublishedMix => mix in PUBLISHED_MIXES;

/**
 * Jobs one simulated run replays, from a trace file, `sacct` or `--jobs`: 40 times the largest
 * preset's, and below the counts (about 120,000) where building a report overran the stack.
 */
export const MAX_TRACE_JOBS = 100_000;
/** The latest arrival, and the longest iteration, in seconds: ten years. */
export const MAX_TRACE_SECONDS = 10 * 365 * 24 * 3600;
/** The most bytes a job moves per iteration or migration: a petabyte, far past any model's. */
const MAX_JOB_BYTES = 1e15;

const seconds = (what: string) =>
  z
    .number({ error: `${what} must be a number` })
    .min(0, { error: `${what} must not be negative` })
    .max(MAX_TRACE_SECONDS, { error: `${what} must be at most ${MAX_TRACE_SECONDS} s (ten years)` });
const bytes = (what: string) =>
  z
    .number({ error: `${what} must be a number` })
    .min(0, { error: `${what} must not be negative` })
    .max(MAX_JOB_BYTES, { error: `${what} must be at most ${MAX_JOB_BYTES} bytes (a petabyte)` });

/**
 * One job of a simulated history: one line of a trace file (JSON lines). Everything the
 * simulator needs is explicit, so a user's own history (from `sacct`, say) replays without
 * the model table; `monkeytree simulate --preset` writes the same lines for generated traces.
 */
export const SimJobSchema = z.strictObject({
  id: idSchema("a job id"),
  /** Seconds from the start of the trace. */
  arrival: seconds("arrival"),
  /** Informational: the model it trains. */
  model: z.string().max(128).optional(),
  /** TP degree: independent DP rings per fragmented rack. */
  rings: z.int().min(1).max(MAX_GPUS_PER_HOST).default(1),
  /** Pipeline stages, each its own DP group. */
  stages: z.int().min(1).max(MAX_HOSTS).default(1),
  /** DP degree in hosts, per stage. */
  hostsPerStage: z.int().min(1).max(MAX_HOSTS),
  iterations: z.int().min(1),
  /** Compute seconds per iteration, without communication. */
  computeSeconds: seconds("computeSeconds"),
  /** Bytes on each hop of each DP ring per iteration. */
  ringBytes: bytes("ringBytes"),
  /** Bytes on each pipeline flow per iteration. */
  ppBytes: bytes("ppBytes").default(0),
  /** Checkpoint bytes of one worker (one host), moved when it migrates. */
  checkpointBytes: bytes("checkpointBytes").default(0),
  /**
   * Bytes each host sends per iteration in its stage's expert-parallel all-to-all to the
   * stage's other hosts, spread evenly over them and over its NICs.
   */
  a2aBytes: bytes("a2aBytes").default(0),
  /**
   * Bytes of the same all-to-all between a host's own GPUs. They pass its NICs and its rack's
   * switch, never an uplink, so nothing but the job itself slows them.
   */
  a2aHostBytes: bytes("a2aHostBytes").default(0),
  /**
   * Fills the cluster before the jobs measured: simulated like the rest, left out of the
   * results, so that those start on a busy, already (de)fragmented cluster.
   */
  warmup: z.boolean().default(false),
});
export type SimJob = z.infer<typeof SimJobSchema>;

/**
 * Parses one trace (parsed JSON values, one per line); errors name the line and field.
 * `lineNumbers` gives each value's line in its file when blank lines were skipped.
 */
export function parseSimJobs(lines: readonly unknown[], source = "trace", lineNumbers?: readonly number[]): SimJob[] {
  const lineOf = (i: number) => lineNumbers?.[i] ?? i + 1;
  if (lines.length > MAX_TRACE_JOBS) throw tooManyJobs(source, lines.length);
  const jobs = lines.map((line, i) => {
    const parsed = SimJobSchema.safeParse(line);
    if (!parsed.success) throw InvalidInputError.fromZod(`${source} line ${lineOf(i)}`, parsed.error);
    return parsed.data;
  });
  const seen = new Set<string>();
  jobs.forEach((job, i) => {
    if (seen.has(job.id))
      throw new InvalidInputError(`${source} line ${lineOf(i)}`, [{ path: "id", message: `job id "${job.id}" is used twice; ids must be unique` }]);
    seen.add(job.id);
  });
  return [...jobs].sort((a, b) => a.arrival - b.arrival);
}

/** A trace of more than `MAX_TRACE_JOBS` jobs (`count`, when known), and how to split it. */
export function tooManyJobs(source: string, count?: number): InvalidInputError {
  const held = count === undefined ? `more than ${MAX_TRACE_JOBS} jobs` : `${count} jobs`;
  return new InvalidInputError(source, [
    {
      path: "",
      message: `${held}; a run replays at most ${MAX_TRACE_JOBS}: split the trace by arrival into files of at most ${MAX_TRACE_JOBS} lines and simulate each`,
    },
  ]);
}

export const GenerateOptionsSchema = z.strictObject({
  seed: z.int(),
  hostCount: z.int().min(1).max(MAX_HOSTS),
  mix: z.enum(SIM_MIXES),
  /** Offered load: expected fraction of hosts busy, counting jobs at their ideal durations. */
  load: z.number().gt(0).max(1),
  jobs: z.int().min(1),
  /** Warm-up jobs drawn the same way before those `jobs`, and marked `warmup`. */
  warmupJobs: z.int().min(0).default(0),
  /** Mean ideal duration of a job, exponentially distributed. */
  meanHours: z.number().gt(0).default(2),
  /**
   * Expert-parallel all-to-all bytes per host per iteration, as a multiple of the host's DP
   * ring bytes (paper §7.10: at least 10); 0 for no EP traffic.
   */
  epFactor: z.number().min(0).default(0),
  /** GPUs (and NICs) per host, over which a host's all-to-all spreads. */
  gpusPerHost: z.int().min(1).max(MAX_GPUS_PER_HOST).default(8),
  /** Local batch in tokens per model replica and iteration: its compute per iteration. */
  tokensPerReplica: z.int().min(1).max(MAX_TOKENS_PER_REPLICA).default(DEFAULT_TOKENS_PER_REPLICA),
});
export type GenerateOptions = z.input<typeof GenerateOptionsSchema>;

/** How a report's generated traces were drawn (the seed, fabric and loads are recorded beside it). */
export const TraceGenerationSchema = GenerateOptionsSchema.pick({
  mix: true,
  jobs: true,
  warmupJobs: true,
  meanHours: true,
  epFactor: true,
  tokensPerReplica: true,
});
export type TraceGeneration = z.infer<typeof TraceGenerationSchema>;

/**
 * A Poisson trace: jobs of the mix (shapes and models as the planner's traces draw them),
 * exponential ideal durations, an arrival rate that offers the target load. Deterministic in
 * the seed; the ids are the model and the arrival number.
 */
export function generateJobs(input: GenerateOptions, nicBytesPerSecond: number): SimJob[] {
  const parsed = GenerateOptionsSchema.safeParse(input);
  if (!parsed.success) throw InvalidInputError.fromZod("trace options", parsed.error);
  const options = parsed.data;
  if (isPublishedMix(options.mix)) return publishedJobs(options, PUBLISHED_MIXES[options.mix], nicBytesPerSecond);
  const random = new Random(options.seed);
  const mix = workload(options.mix, options.hostCount);
  const meanSeconds = options.meanHours * 3600;
  const rate = (options.load * options.hostCount) / (mix.meanHosts * meanSeconds);
  let now = 0;
  return Array.from({ length: options.warmupJobs + options.jobs }, (_, n) => {
    now += random.exponential(rate);
    const spec = mix.draw(random, n);
    const name = spec.id.slice(0, spec.id.lastIndexOf("-"));
    const model = MODELS[name];
    if (!model) throw new RangeError(`no model named ${name} in the model table`);
    const cost = iterationCost(model, spec, options.tokensPerReplica);
    // The made-up factor sizes only what crosses hosts.
    const traffic = { ...cost, a2aBytes: options.epFactor * cost.ringBytes * spec.rings, a2aHostBytes: 0 };
    const ideal = iterationSeconds({ ...spec, ...traffic }, idealRates(nicBytesPerSecond, options.gpusPerHost));
    const iterations = Math.max(1, Math.round(random.exponential(1 / meanSeconds) / ideal));
    const warmup = n < options.warmupJobs;
    return {
      id: spec.id,
      arrival: now,
      model: name,
      rings: spec.rings,
      stages: spec.stages,
      hostsPerStage: spec.hostsPerStage,
      iterations,
      ...traffic,
      warmup,
    };
  });
}

/** The published job types' tensor-parallel groups fill a host of this many GPUs. */
const PUBLISHED_GPUS_PER_HOST = 8;

/**
 * A trace of the published workload, drawn as its authors' generator draws one: a type by
 * weight, a GPU count and 100–1,000 iterations uniformly, the first arrival at 0 and Poisson
 * arrivals at the rate that offers the load, reckoned as theirs is (`meanGpuSeconds`).
 */
function publishedJobs(options: z.infer<typeof GenerateOptionsSchema>, types: readonly JobType[], nicBytesPerSecond: number): SimJob[] {
  const gpus = options.hostCount * options.gpusPerHost;
  const largest = Math.max(...types.flatMap((type) => type.gpus));
  const problems = [
    ...(options.gpusPerHost === PUBLISHED_GPUS_PER_HOST
      ? []
      : [{ path: "gpusPerHost", message: `the ${options.mix} mix's jobs fill hosts of ${PUBLISHED_GPUS_PER_HOST} GPUs, not ${options.gpusPerHost}` }]),
    ...(gpus >= largest
      ? []
      : [
          {
            path: "hostCount",
            message: `the ${options.mix} mix has jobs of ${largest} GPUs; give a cluster of at least ${largest / options.gpusPerHost} hosts`,
          },
        ]),
  ];
  if (problems.length) throw new InvalidInputError("trace options", problems);
  const random = new Random(options.seed);
  const rate = (options.load * gpus) / meanGpuSeconds(types, nicBytesPerSecond);
  let now = 0;
  return Array.from({ length: options.warmupJobs + options.jobs }, (_, n) => {
    const { type, gpus: size, iterations } = drawPublished(random, types);
    const arrival = now;
    now += random.exponential(rate);
    const job = publishedJob(type, size, options.gpusPerHost);
    return { id: `${type.model}-${n}`, arrival, model: type.model, iterations, ...job, warmup: n < options.warmupJobs };
  });
}

/**
 * What a job's flows get, in bytes/s: each ring and pipeline flow, the all-to-all as a host's
 * total sending rate to other hosts, and `host`, a host's NICs at full speed.
 */
export interface IterationRates {
  readonly ring: number;
  readonly pp: number;
  readonly a2a: number;
  readonly host: number;
}

/** Every flow at full speed: `nic` bytes/s per NIC, `gpusPerHost` NICs per host. */
export function idealRates(nic: number, gpusPerHost: number): IterationRates {
  return { ring: nic, pp: nic, a2a: nic * gpusPerHost, host: nic * gpusPerHost };
}

/**
 * Seconds of one iteration at the given rates: compute, stretched where pipeline transfers
 * cannot keep up, then the all-reduce and the all-to-all.
 */
export function iterationSeconds(
  job: Pick<SimJob, "hostsPerStage" | "stages" | "computeSeconds" | "ringBytes" | "ppBytes" | "a2aBytes" | "a2aHostBytes">,
  rates: IterationRates,
): number {
  const ring = job.hostsPerStage > 1 && job.ringBytes > 0 ? job.ringBytes / rates.ring : 0;
  const pp = job.stages > 1 && job.ppBytes > 0 ? job.ppBytes / rates.pp : 0;
  const a2a = (job.hostsPerStage > 1 && job.a2aBytes > 0 ? job.a2aBytes / rates.a2a : 0) + job.a2aHostBytes / rates.host;
  return Math.max(job.computeSeconds, pp) + ring + a2a;
}
