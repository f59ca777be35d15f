import { z } from "zod";
import type { FabricShape } from "./fabric.ts";
import type { SimConfigInput, SystemName } from "./simulate.ts";
import { SYSTEMS_2TIER } from "./simulate.ts";
import type { SimMix } from "./jobs.ts";
import { SCHEDULERS } from "./scheduler.ts";

/**
 * One point of a preset's sweep beside its loads (a λ, a front-end, a fabric): what it changes
 * of the preset's settings. Every variant runs every load and system.
 */
export const VariantSchema = z.strictObject({
  /** Short and flag-friendly: `--variants` picks variants by name. */
  name: z.string(),
  fabric: z
    .strictObject({ racks: z.int().min(1), hostsPerRack: z.int().min(1), uplinksPerRack: z.int().min(1) })
    .partial()
    .optional(),
  lambda: z.int().min(0).optional(),
  scheduler: z.enum(SCHEDULERS).optional(),
  sglbK: z.int().min(1).optional(),
});
export type Variant = z.infer<typeof VariantSchema>;

/** A named experiment: the fabric, MonkeyTree's bound, and the traces to generate. */
export interface Preset {
  readonly description: string;
  readonly fabric: FabricShape;
  readonly lambda?: number;
  readonly mix: SimMix;
  readonly loads: readonly number[];
  readonly jobs: number;
  /** Mean ideal job duration of the planner's mixes (the paper mix's jobs count iterations); default 2. */
  readonly meanHours?: number;
  readonly systems: readonly SystemName[];
  /** Expert-parallel all-to-all bytes per host as a multiple of its DP ring bytes. */
  readonly epFactor?: number;
  /** Whether the queue starts jobs while a migration moves state; the paper's simulator holds it. */
  readonly queueInMoves?: "place" | "hold";
  /** Whether a plan's jobs move together or each on its own; the paper's simulator moves each alone. */
  readonly migrateBy?: "plan" | "job";
  /** Jobs run before the measured ones, to start them on a busy cluster. */
  readonly warmupJobs?: number;
  /** SGLB's choice set; the paper's figures give it half the rack's uplinks. */
  readonly sglbK?: number;
  /** A sweep beside the loads; none: the preset's settings as they are. */
  readonly variants?: readonly Variant[];
}

/** A preset's simulation settings, before any flag or variant changes them. */
export function presetConfig(preset: Preset): Pick<SimConfigInput, "fabric" | "lambda" | "queueInMoves" | "migrateBy" | "sglbK"> {
  const { fabric, lambda, queueInMoves, migrateBy, sglbK } = preset;
  return {
    fabric,
    ...(lambda === undefined ? {} : { lambda }),
    ...(queueInMoves === undefined ? {} : { queueInMoves }),
    ...(migrateBy === undefined ? {} : { migrateBy }),
    ...(sglbK === undefined ? {} : { sglbK }),
  };
}

/** How a preset's traces are drawn, before any flag changes it. */
export function presetGeneration(preset: Preset): { mix: SimMix; warmupJobs: number; meanHours?: number; epFactor?: number } {
  const { mix, warmupJobs, meanHours, epFactor } = preset;
  return { mix, warmupJobs: warmupJobs ?? 0, ...(meanHours === undefined ? {} : { meanHours }), ...(epFactor === undefined ? {} : { epFactor }) };
}

/** What `variant` makes of a simulation's settings. */
export function applyVariant(config: SimConfigInput, variant: Variant | null): SimConfigInput {
  if (variant === null) return config;
  const { fabric, lambda, scheduler, sglbK } = variant;
  return {
    ...config,
    fabric: { ...config.fabric, ...fabric },
    ...(lambda === undefined ? {} : { lambda }),
    ...(scheduler === undefined ? {} : { scheduler }),
    ...(sglbK === undefined ? {} : { sglbK }),
  };
}

/** The settings some variant of `variants` sets: the fabric's by their field, λ, the front-end. */
export function sweptSettings(variants: readonly Variant[]): ("racks" | "hostsPerRack" | "uplinksPerRack" | "lambda" | "scheduler")[] {
  const fabric = variants.flatMap((v) => Object.keys(v.fabric ?? {}) as (keyof NonNullable<Variant["fabric"]>)[]);
  return [
    ...new Set([
      ...fabric,
      ...(variants.some((v) => v.lambda !== undefined) ? (["lambda"] as const) : []),
      ...(variants.some((v) => v.scheduler !== undefined) ? (["scheduler"] as const) : []),
    ]),
  ];
}

const PAPER_LOADS = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0] as const;
/** 1,024 GPUs: 16 racks of 8 hosts of 8 GPUs, a 400 Gbps NIC per GPU (paper §7.1). */
const GPUS_1024 = { racks: 16, hostsPerRack: 8, gpusPerHost: 8, nicGbps: 400 } as const;

/** SGLB's K in the paper's figures: half the spines a rack reaches. */
const halfOf = (uplinks: number): number => Math.max(1, Math.floor(uplinks / 2));

/**
 * What the paper's figures share, as its authors' simulator runs them: Fig. 6's fabric, their
 * published workload in traces of 2,400 jobs (their figures' data came from traces of about
 * that many; their scripts' default of 1,000 ends before a cluster at 80% load fills), a queue
 * that places nothing while a migration moves state, each job of a plan moved on its own, and
 * SGLB choosing among half the spines.
 */
const FIGURE = {
  fabric: { ...GPUS_1024, uplinksPerRack: 16 },
  mix: "paper",
  jobs: 2400,
  queueInMoves: "hold",
  migrateBy: "job",
  sglbK: 8,
} as const;

export const PRESETS = {
  "paper-1024": {
    description: "§7.2: 1,024 GPUs, 16 uplinks per rack (4:1), the TP8+PP / DP mix, loads 50-100%",
    fabric: { ...GPUS_1024, uplinksPerRack: 16 },
    mix: "tp8pp",
    loads: PAPER_LOADS,
    jobs: 1000,
    meanHours: 2,
    systems: SYSTEMS_2TIER,
  },
  "paper-1024-dp": {
    description: "§7.7: 1,024 GPUs, 4 uplinks per rack (16:1), DP/FSDP jobs only, λ = 4",
    fabric: { ...GPUS_1024, uplinksPerRack: 4 },
    mix: "dp",
    loads: PAPER_LOADS,
    jobs: 1200,
    meanHours: 2,
    systems: SYSTEMS_2TIER,
  },
  "moves-1024": {
    description: "§7.5: 1,024 GPUs, DP/FSDP jobs, λ = 2: how many moves each defragmentation needs",
    fabric: { ...GPUS_1024, uplinksPerRack: 4 },
    lambda: 2,
    mix: "dp",
    loads: [0.9],
    jobs: 1000,
    meanHours: 2,
    systems: ["monkeytree"],
  },
  "paper-3tier": {
    description: "§7.8: 1,024 GPUs in a 3-tier Clos, 4 pods of 4 racks, 16 uplinks per rack (4:1) and 16 core links per pod (4:1), loads 50-100%",
    fabric: { ...GPUS_1024, uplinksPerRack: 16, racksPerPod: 4, aggUplinks: 1 },
    mix: "tp8pp",
    loads: PAPER_LOADS,
    jobs: 1000,
    meanHours: 2,
    systems: ["ecmp", "crux", "sglb", "perfect", "monkeytree", "monkeytree3", "spray"],
  },
  "paper-rail": {
    description: "§7.8: 1,024 GPUs rail-optimised, 16 pods of 8 hosts, 8 rails each with 2 uplinks (4:1), loads 50-100%",
    fabric: { ...GPUS_1024, uplinksPerRack: 16, uplinksPerRail: 2 },
    mix: "tp8pp",
    loads: PAPER_LOADS,
    jobs: 1000,
    meanHours: 2,
    systems: ["ecmp", "crux", "sglb", "perfect", "monkeytree", "spray"],
  },
  "frag-1024": {
    description: "§7.3: 1,024 GPUs, 3 uplinks per rack, DP/FSDP jobs only, 90% load: fragmentation over time",
    fabric: { ...GPUS_1024, uplinksPerRack: 3 },
    mix: "dp",
    loads: [0.9],
    jobs: 1000,
    meanHours: 2,
    systems: ["ecmp", "crux", "monkeytree"],
  },
  "paper-2048-16to1": {
    description: "§7.6: 2,048 GPUs, 256 GPUs and 16 uplinks per rack (16:1, the fewest uplinks for TP8's rings), the TP8+PP / DP mix, 90-100% load",
    fabric: { racks: 8, hostsPerRack: 32, gpusPerHost: 8, nicGbps: 400, uplinksPerRack: 16 },
    mix: "tp8pp",
    loads: [0.9, 1],
    jobs: 1000,
    meanHours: 2,
    systems: ["ecmp", "crux", "sglb", "perfect", "monkeytree", "spray"],
  },
  "paper-ep": {
    description:
      "§7.10: 1,024 GPUs, 16 uplinks per rack, every job EP-dominated (10× more all-to-all than ring bytes), 100 jobs per load after 50 that fill the cluster",
    fabric: { ...GPUS_1024, uplinksPerRack: 16 },
    mix: "tp8pp",
    loads: PAPER_LOADS,
    jobs: 100,
    meanHours: 2,
    systems: SYSTEMS_2TIER,
    epFactor: 10,
    warmupJobs: 50,
  },
  "fig-slowdown": {
    description: "Fig. 6: 1,024 GPUs, 16 uplinks per rack (4:1), the workload the paper's authors published, loads 50-100%",
    ...FIGURE,
    loads: PAPER_LOADS,
    systems: SYSTEMS_2TIER,
  },
  "fig-fragmentation": {
    description: "Fig. 7: 1,024 GPUs, 3 uplinks per rack, the published DP and FSDP jobs, loads 70-100%: fragmentation over time",
    ...FIGURE,
    fabric: { ...GPUS_1024, uplinksPerRack: 3 },
    mix: "paper-dp",
    loads: [0.7, 0.8, 0.9, 1],
    systems: ["ecmp", "crux", "monkeytree"],
  },
  "fig-oversubscription": {
    description: "Fig. 8: 2,048 GPUs in racks of 16-256 GPUs with 16-64 uplinks each (variants g<GPUs per rack>-u<uplinks>), 80% load",
    ...FIGURE,
    fabric: { racks: 8, hostsPerRack: 32, gpusPerHost: 8, nicGbps: 400, uplinksPerRack: 16 },
    loads: [0.8],
    systems: ["ecmp", "crux", "sglb", "perfect", "monkeytree"],
    variants: [16, 32, 64, 128, 256].flatMap((gpus) =>
      [16, 32, 64]
        .filter((uplinks) => uplinks <= gpus)
        .map((uplinks) => ({
          name: `g${gpus}-u${uplinks}`,
          fabric: { racks: 2048 / gpus, hostsPerRack: gpus / 8, uplinksPerRack: uplinks },
          sglbK: halfOf(uplinks),
        })),
    ),
  },
  "fig-moves": {
    description: "Fig. 9: MonkeyTree's moves per defragmentation event on 128-2,048 GPUs (variants gpus-<N>), racks of 64 GPUs with 16 uplinks, loads 70-100%",
    ...FIGURE,
    loads: [0.7, 0.8, 0.9, 1],
    systems: ["monkeytree"],
    variants: [128, 256, 512, 1024, 2048].map((gpus) => ({ name: `gpus-${gpus}`, fabric: { racks: gpus / 64 } })),
  },
  "fig-migration-duration": {
    description: "Fig. 12: how long MonkeyTree's migrations take, stop to restart, on Fig. 6's cluster at loads 70-100%",
    ...FIGURE,
    loads: [0.7, 0.8, 0.9, 1],
    systems: ["monkeytree"],
  },
  "fig-threshold": {
    description:
      "Fig. 13: MonkeyTree's bound λ from 2 to 8 (variants lambda-<λ>), 1,024 GPUs with 4 uplinks per rack (16:1), 1,200 published DP and FSDP jobs at 100% load",
    ...FIGURE,
    fabric: { ...GPUS_1024, uplinksPerRack: 4 },
    mix: "paper-dp",
    loads: [1],
    jobs: 1200,
    systems: ["monkeytree"],
    variants: [2, 3, 4, 5, 6, 7, 8].map((lambda) => ({ name: `lambda-${lambda}`, lambda })),
  },
  "fig-rail": {
    description: "Fig. 14a: 1,024 GPUs rail-optimised, 8 pods of 16 hosts, each rail with 2 uplinks (8:1), λ = 2, loads 50-100%",
    ...FIGURE,
    // The artifact bounds a pod by one rail's spines, so a tensor-parallel job (8 rings) never spans pods.
    lambda: 2,
    fabric: { racks: 8, hostsPerRack: 16, gpusPerHost: 8, nicGbps: 400, uplinksPerRack: 16, uplinksPerRail: 2 },
    loads: PAPER_LOADS,
    systems: ["ecmp", "crux", "sglb", "perfect", "monkeytree"],
    sglbK: 1,
  },
  "fig-3tier": {
    description:
      "Fig. 14b: 1,024 GPUs in a 3-tier Clos, 4 pods of 4 racks, 16 uplinks per rack (4:1), each aggregation switch linked to all 16 cores, loads 50-100%",
    ...FIGURE,
    fabric: { ...GPUS_1024, uplinksPerRack: 16, racksPerPod: 4, aggUplinks: 16 },
    loads: PAPER_LOADS,
    systems: ["ecmp", "crux", "sglb", "perfect", "monkeytree", "monkeytree3"],
  },
  "fig-frontend": {
    description: "Fig. 15: MonkeyTree behind each front-end (variants best-fit, fifo, random), 512 GPUs with 16 uplinks per rack (4:1), loads 10-100%",
    ...FIGURE,
    fabric: { ...GPUS_1024, racks: 8, uplinksPerRack: 16 },
    loads: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1],
    systems: ["monkeytree"],
    variants: SCHEDULERS.map((scheduler) => ({ name: scheduler, scheduler })),
  },
  "fig-ep": {
    description:
      "Fig. 16: EP-dominated jobs on 1,024 GPUs with 2-16 uplinks per rack (variants u<uplinks>), λ = 2, 100 jobs after 50 that fill the cluster, 100% load",
    ...FIGURE,
    lambda: 2,
    mix: "paper-ep",
    loads: [1],
    jobs: 100,
    warmupJobs: 50,
    systems: ["ecmp", "crux", "perfect", "sglb", "monkeytree", "monkeytree-sglb"],
    variants: [2, 4, 8, 16].map((uplinks) => ({ name: `u${uplinks}`, fabric: { uplinksPerRack: uplinks }, sglbK: halfOf(uplinks) })),
  },
  small: {
    description: "a quick look: 512 GPUs (8 racks of 8 hosts), 2 uplinks per rack (32:1), 100 DP/FSDP jobs at 90% load",
    fabric: { racks: 8, hostsPerRack: 8, gpusPerHost: 8, nicGbps: 400, uplinksPerRack: 2 },
    mix: "dp",
    loads: [0.9],
    jobs: 100,
    meanHours: 2,
    systems: ["ecmp", "perfect", "monkeytree", "spray"],
  },
} as const satisfies Record<string, Preset>;
export type PresetName = keyof typeof PRESETS;
