import type { Random } from "./random.ts";

/**
 * The workload the paper's authors published with their evaluation (the public repository
 * hipersys-team/MonkeyTreeArtifact): ten job types, each a model's compute and bytes per
 * iteration (`jobs/*.yaml`), with the weights and GPU counts of the main experiments' mix
 * (`scripts/experiments/run_load_vs_slowdown.py`), and traces drawn the way its
 * `scripts/generate_trace.py` draws them. Facts and numbers only; the drawing is ours.
 *
 * The artifact simulates one GPU per node, each with its own NIC. Here a host holds
 * `gpusPerHost` GPUs with a NIC each, so a job's per-GPU flows become per-host figures: a ring
 * hop carries what one GPU sends to the next, and a host's all-to-all and migration bytes are
 * its GPUs' together.
 */

/** How a job type's GPUs communicate in one iteration, after its compute. */
type Pattern =
  /** One ring all-reduce of the model's bytes over all the job's GPUs (DP, FSDP). */
  | { readonly kind: "all-reduce" }
  /**
   * `stride` rings, each over every `stride`-th GPU (TP8 in a server, DP across servers): one
   * ring per GPU of a host, over the job's hosts.
   */
  | { readonly kind: "strided"; readonly stride: number; readonly bytes: number }
  /**
   * GPipe over `stages` stages of `tp`-GPU tensor-parallel groups; activations to the next
   * stage forward and their gradients back; then an all-reduce of each stage's shard across
   * the stage's data-parallel replicas.
   */
  | {
      readonly kind: "pipeline";
      readonly stages: number;
      readonly tp: number;
      readonly microbatches: number;
      readonly forwardUs: number;
      readonly backwardUs: number;
      readonly activationBytes: number;
      readonly shardBytes: number;
    }
  /** Expert parallelism: all-to-all rounds between the compute steps, `a2aBytes` in all, then an all-reduce. */
  | { readonly kind: "moe"; readonly a2aBytes: number };

export interface JobType {
  readonly model: string;
  /** Relative frequency in the mix. */
  readonly weight: number;
  /** GPU counts a job of this type runs on, drawn uniformly. */
  readonly gpus: readonly number[];
  /** Compute per iteration; a pipeline's comes from its passes. */
  readonly computeUs: number;
  /** Bytes each GPU all-reduces (`all-reduce`, `moe`). */
  readonly modelBytes: number;
  readonly pattern: Pattern;
}

const FSDP_GPUS = [16, 24, 32] as const;
/** 23 rounds of 376 MB and one of 188 MB between a MoE model's 24 compute steps. */
const MOE_A2A_BYTES = 23 * 376e6 + 188e6;
const LLAMA_70B_TP_BYTES = 17.18e9;
const ACTIVATION_BYTES = 8.39e6;

/** The ten types of the paper's main evaluation mix (Figs. 6, 8), weights summing to 352. */
export const PUBLISHED_TYPES: readonly JobType[] = [
  { model: "llama2-70b-fsdp", weight: 25, gpus: FSDP_GPUS, computeUs: 2_378_000, modelBytes: 137.43e9, pattern: { kind: "all-reduce" } },
  { model: "llama3-70b-fsdp", weight: 25, gpus: FSDP_GPUS, computeUs: 5_258_000, modelBytes: 137.43e9, pattern: { kind: "all-reduce" } },
  { model: "gpt-7b-dp", weight: 25, gpus: FSDP_GPUS, computeUs: 113_000, modelBytes: 13e9, pattern: { kind: "all-reduce" } },
  { model: "gpt-13b-dp", weight: 25, gpus: FSDP_GPUS, computeUs: 215_000, modelBytes: 26e9, pattern: { kind: "all-reduce" } },
  { model: "gpt-oss-20b-dp-moe", weight: 1, gpus: [16], computeUs: 24 * 133_000, modelBytes: 8.8e9, pattern: { kind: "moe", a2aBytes: MOE_A2A_BYTES } },
  { model: "gpt-oss-120b-dp-moe", weight: 1, gpus: [16], computeUs: 24 * 106_000, modelBytes: 11.42e9, pattern: { kind: "moe", a2aBytes: MOE_A2A_BYTES } },
  {
    model: "llama2-70b-tp-dp",
    weight: 100,
    gpus: [16, 32],
    computeUs: 341_000,
    modelBytes: 0,
    pattern: { kind: "strided", stride: 8, bytes: LLAMA_70B_TP_BYTES },
  },
  {
    model: "llama3-70b-tp-dp",
    weight: 100,
    gpus: [16, 32],
    computeUs: 743_000,
    modelBytes: 0,
    pattern: { kind: "strided", stride: 8, bytes: LLAMA_70B_TP_BYTES },
  },
  {
    model: "llama2-70b-tp-dp-pp2",
    weight: 25,
    gpus: [32, 48, 64],
    computeUs: 0,
    modelBytes: 0,
    pattern: {
      kind: "pipeline",
      stages: 2,
      tp: 8,
      microbatches: 8,
      forwardUs: 60_000,
      backwardUs: 111_000,
      activationBytes: ACTIVATION_BYTES,
      shardBytes: 8.59e9,
    },
  },
  {
    model: "llama2-70b-tp-dp-pp4",
    weight: 25,
    gpus: [64],
    computeUs: 0,
    modelBytes: 0,
    pattern: {
      kind: "pipeline",
      stages: 4,
      tp: 8,
      microbatches: 8,
      forwardUs: 30_000,
      backwardUs: 56_000,
      activationBytes: ACTIVATION_BYTES,
      shardBytes: 4.295e9,
    },
  },
];

/**
 * The expert-parallel models of the paper's EP figure (the artifact's `jobs/seq16k`, 16k-token
 * sequences): a compute step, an all-to-all whose bytes per GPU are about ten times its
 * all-reduce's, then the all-reduce. The artifact gives no weights: each is as likely.
 */
const EP_TYPES: readonly JobType[] = [
  { model: "gpt-20b-ep16", weight: 1, gpus: [16], computeUs: 638_000, modelBytes: 1.7976e9, pattern: { kind: "moe", a2aBytes: 543.58e9 } },
  { model: "gpt-20b-ep32", weight: 1, gpus: [32], computeUs: 629_000, modelBytes: 1.7976e9, pattern: { kind: "moe", a2aBytes: 1123.4e9 } },
  { model: "gpt-120b-ep32", weight: 1, gpus: [32], computeUs: 955_000, modelBytes: 2.18e9, pattern: { kind: "moe", a2aBytes: 1685.1e9 } },
  { model: "qwen3-a3b-ep16", weight: 1, gpus: [16], computeUs: 1_230_000, modelBytes: 1.541e9, pattern: { kind: "moe", a2aBytes: 1546.19e9 } },
  { model: "qwen3-a3b-ep32", weight: 1, gpus: [32], computeUs: 1_230_000, modelBytes: 1.541e9, pattern: { kind: "moe", a2aBytes: 3195.46e9 } },
];

/**
 * The published mixes by name: `paper`, the main evaluation's ten types; `paper-dp`, its pure
 * data-parallel and FSDP types (one ring each, as the fragmentation and threshold figures
 * run); `paper-ep`, the EP figure's models.
 */
export const PUBLISHED_MIXES = {
  paper: PUBLISHED_TYPES,
  "paper-dp": PUBLISHED_TYPES.filter((type) => type.pattern.kind === "all-reduce"),
  "paper-ep": EP_TYPES,
} as const satisfies Record<string, readonly JobType[]>;
export type PublishedMix = keyof typeof PUBLISHED_MIXES;

/** Iterations per job, drawn uniformly (inclusive), as the artifact's traces do. */
export const PUBLISHED_ITERATIONS = { min: 100, max: 1000 } as const;

/** A job of `type` on `gpus` GPUs, in the simulator's units (`SimJob`'s fields). */
export interface PublishedJob {
  readonly rings: number;
  readonly stages: number;
  readonly hostsPerStage: number;
  readonly computeSeconds: number;
  readonly ringBytes: number;
  readonly ppBytes: number;
  readonly a2aBytes: number;
  readonly a2aHostBytes: number;
  readonly checkpointBytes: number;
}

/** Bytes each member of a ring all-reduce of `bytes` over `members` sends to the next. */
const ringHop = (bytes: number, members: number): number => (members > 1 ? (2 * (members - 1) * bytes) / members : 0);

/**
 * `type` on `gpus` GPUs, hosts of `gpusPerHost`. A moved host carries what its GPUs send in
 * an iteration, as the artifact sizes a migration's flows.
 * @throws RangeError where the GPUs do not split into whole hosts, stages and groups.
 */
export function publishedJob(type: JobType, gpus: number, gpusPerHost: number): PublishedJob {
  const hosts = gpus / gpusPerHost;
  if (!Number.isInteger(hosts)) throw new RangeError(`${type.model}: ${gpus} GPUs are not whole hosts of ${gpusPerHost}`);
  const { pattern } = type;
  const computeSeconds = type.computeUs / 1e6;
  const host = (perGpu: number) => perGpu * gpusPerHost;
  switch (pattern.kind) {
    case "all-reduce": {
      const ringBytes = ringHop(type.modelBytes, gpus);
      return {
        rings: 1,
        stages: 1,
        hostsPerStage: hosts,
        computeSeconds,
        ringBytes,
        ppBytes: 0,
        a2aBytes: 0,
        a2aHostBytes: 0,
        checkpointBytes: host(ringBytes),
      };
    }
    case "moe": {
      const ringBytes = ringHop(type.modelBytes, gpus);
      // Each GPU sends the same to every other: to its host's other GPUs, a share that never
      // meets another job's traffic.
      const sent = host(pattern.a2aBytes / gpus);
      const a2aBytes = (sent * (gpus - gpusPerHost)) / (gpus - 1);
      return {
        rings: 1,
        stages: 1,
        hostsPerStage: hosts,
        computeSeconds,
        ringBytes,
        ppBytes: 0,
        a2aBytes,
        a2aHostBytes: sent - a2aBytes,
        checkpointBytes: host(ringBytes) + sent,
      };
    }
    case "strided": {
      if (pattern.stride !== gpusPerHost) throw new RangeError(`${type.model}: its ${pattern.stride} rings need hosts of ${pattern.stride} GPUs`);
      const ringBytes = ringHop(pattern.bytes, gpus / pattern.stride);
      return {
        rings: pattern.stride,
        stages: 1,
        hostsPerStage: hosts,
        computeSeconds,
        ringBytes,
        ppBytes: 0,
        a2aBytes: 0,
        a2aHostBytes: 0,
        checkpointBytes: host(ringBytes),
      };
    }
    case "pipeline": {
      const { stages, tp, microbatches } = pattern;
      if (tp !== gpusPerHost || hosts % stages) throw new RangeError(`${type.model}: ${gpus} GPUs do not make ${stages} stages of whole ${tp}-GPU hosts`);
      const hostsPerStage = hosts / stages;
      const ringBytes = ringHop(pattern.shardBytes, hostsPerStage);
      // Activations forward and their gradients back, every microbatch.
      const ppBytes = 2 * microbatches * pattern.activationBytes;
      // GPipe: the last microbatch's passes start stages − 1 slots after the first's.
      const slots = stages + microbatches - 1;
      return {
        rings: tp,
        stages,
        hostsPerStage,
        computeSeconds: (slots * (pattern.forwardUs + pattern.backwardUs)) / 1e6,
        ringBytes,
        ppBytes,
        a2aBytes: 0,
        a2aHostBytes: 0,
        checkpointBytes: host(ringBytes + ppBytes),
      };
    }
  }
}

/**
 * Seconds of one iteration as the artifact's trace generator counts them to set its arrival
 * rate: compute plus each GPU's bytes at `bytesPerSecond`, with no pipeline bubble. Used only
 * for that, so that a load here offers what the same load offered the paper's simulations.
 */
export function publishedIterationSeconds(type: JobType, gpus: number, bytesPerSecond: number): number {
  const { pattern } = type;
  switch (pattern.kind) {
    case "all-reduce":
      return type.computeUs / 1e6 + ringHop(type.modelBytes, gpus) / bytesPerSecond;
    case "moe":
      return type.computeUs / 1e6 + (pattern.a2aBytes / gpus + ringHop(type.modelBytes, gpus)) / bytesPerSecond;
    case "strided":
      return type.computeUs / 1e6 + ringHop(pattern.bytes, gpus / pattern.stride) / bytesPerSecond;
    case "pipeline": {
      const replicas = gpus / (pattern.stages * pattern.tp);
      const compute = (pattern.microbatches * (pattern.forwardUs + pattern.backwardUs)) / 1e6;
      return compute + (2 * pattern.microbatches * pattern.activationBytes + ringHop(pattern.shardBytes, replicas)) / bytesPerSecond;
    }
  }
}

/** Expected GPU-seconds of one job of the mix, at the mean iteration count, as the artifact sets its arrival rate. */
export function meanGpuSeconds(types: readonly JobType[], bytesPerSecond: number): number {
  const total = types.reduce((sum, t) => sum + t.weight, 0);
  const iterations = Math.floor((PUBLISHED_ITERATIONS.min + PUBLISHED_ITERATIONS.max) / 2);
  return types.reduce((sum, type) => {
    const perCount = type.gpus.reduce((s, gpus) => s + iterations * publishedIterationSeconds(type, gpus, bytesPerSecond) * gpus, 0);
    return sum + (type.weight / total) * (perCount / type.gpus.length);
  }, 0);
}

/** One draw of the artifact's generator: a type by weight, then its GPU count and iterations, uniformly. */
export function drawPublished(random: Random, types: readonly JobType[]): { type: JobType; gpus: number; iterations: number } {
  const type = random.weighted(types.map((t) => [t, t.weight] as const));
  const gpus = random.choice(type.gpus);
  return { type, gpus, iterations: random.int(PUBLISHED_ITERATIONS.min, PUBLISHED_ITERATIONS.max) };
}
