/**
 * The paper's §7 model table (Table 3) and what one training iteration of each costs, after
 * the estimates it cites (Rail-only, §7.1): compute is 6 FLOPs per active parameter per
 * token; DP moves a ring all-reduce of the bf16 gradients, 2(d−1)/d of their bytes on each
 * hop; FSDP all-gathers the parameters twice and reduce-scatters the gradients, 3(d−1)/d;
 * TP shards both across the host's GPUs, each shard its own ring; PP splits them by stage
 * and sends activations between stages. A worker's checkpoint is its weights, master weights
 * and Adam moments, 16 bytes per parameter it holds.
 */
export interface ModelSpec {
  /** Parameters. */
  readonly parameters: number;
  /** Parameters active per token (all of them for dense models, the routed experts' for MoE). */
  readonly active: number;
  /** Hidden size, for pipeline activations. */
  readonly hidden: number;
  /** Whether its data parallelism is FSDP (parameters sharded) rather than replicated DP. */
  readonly fsdp: boolean;
}

export const MODELS: Readonly<Record<string, ModelSpec>> = {
  "gpt3-7b": { parameters: 6.7e9, active: 6.7e9, hidden: 4096, fsdp: false },
  "gpt3-13b": { parameters: 13e9, active: 13e9, hidden: 5120, fsdp: false },
  "gpt-oss-20b": { parameters: 21e9, active: 3.6e9, hidden: 2880, fsdp: true },
  "gpt-oss-120b": { parameters: 117e9, active: 5.1e9, hidden: 2880, fsdp: true },
  "llama2-70b": { parameters: 69e9, active: 69e9, hidden: 8192, fsdp: true },
  "llama3-70b": { parameters: 70.6e9, active: 70.6e9, hidden: 8192, fsdp: true },
};

/** H100 dense bf16 peak, at a model FLOPs utilisation typical of large training runs. */
const GPU_FLOPS = 989e12;
const MFU = 0.4;
/**
 * Local batch 16 (Table 1) of 4,096-token sequences, per model replica and iteration: one GPU
 * of a DP/FSDP job, one TP×PP group of a TP job. The paper does not state its own; it sets
 * how much of an iteration is computation, so how much congestion can slow a job.
 */
export const DEFAULT_TOKENS_PER_REPLICA = 16 * 4096;
/** 4,096 sequences of 4,096 tokens: past any local batch that fits a replica's memory. */
export const MAX_TOKENS_PER_REPLICA = 4096 * 4096;
const BF16 = 2;
const CHECKPOINT_BYTES_PER_PARAMETER = 16;

/** How one job is parallelised, in the units of placement. */
export interface Parallelism {
  /** TP degree: independent DP rings per host (1 for DP/FSDP). */
  readonly rings: number;
  readonly stages: number;
  /** DP degree in hosts, per stage. */
  readonly hostsPerStage: number;
}

/** What the simulator needs of a job's iteration. */
export interface IterationCost {
  /** Seconds of computation per iteration, with no communication. */
  readonly computeSeconds: number;
  /** Bytes each hop of each DP ring carries per iteration. */
  readonly ringBytes: number;
  /** Bytes each pipeline flow carries per iteration (activations forward, gradients back). */
  readonly ppBytes: number;
  /** Checkpoint bytes of one host's worker. */
  readonly checkpointBytes: number;
}

export function iterationCost(model: ModelSpec, p: Parallelism, tokensPerReplica = DEFAULT_TOKENS_PER_REPLICA): IterationCost {
  // A host of a DP/FSDP job is gpusPerHost replicas reduced over NVLink first; a TP host is
  // one replica's slice of a stage.
  const replicaGpus = p.rings === 1 ? 1 : p.rings * p.stages;
  const computeSeconds = (6 * model.active * tokensPerReplica) / (replicaGpus * GPU_FLOPS * MFU);
  const d = p.hostsPerStage;
  const shardBytes = (BF16 * model.parameters) / (p.rings * p.stages);
  const ringBytes = d < 2 ? 0 : ((model.fsdp ? 3 : 2) * (d - 1) * shardBytes) / d;
  const ppBytes = p.stages < 2 ? 0 : tokensPerReplica * model.hidden * BF16;
  const held = (CHECKPOINT_BYTES_PER_PARAMETER * model.parameters) / (p.stages * (model.fsdp ? d : 1));
  return { computeSeconds, ringBytes, ppBytes, checkpointBytes: held };
}
