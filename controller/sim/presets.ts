import type { FabricShape } from "./fabric.ts";
import type { SystemName } from "./simulate.ts";
import { SYSTEMS_2TIER } from "./simulate.ts";
import type { SimMix } from "./jobs.ts";

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
  /** Jobs run before the measured ones, to start them on a busy cluster. */
  readonly warmupJobs?: number;
}

const PAPER_LOADS = [0.5, 0.6, 0.7, 0.8, 0.9, 1.0] as const;
/** 1,024 GPUs: 16 racks of 8 hosts of 8 GPUs, a 400 Gbps NIC per GPU (paper §7.1). */
const GPUS_1024 = { racks: 16, hostsPerRack: 8, gpusPerHost: 8, nicGbps: 400 } as const;

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
    description: "§7.10: 1,024 GPUs, 16 uplinks per rack, every job EP-dominated (10× more all-to-all than ring bytes), 100 jobs per load after 50 that fill the cluster",
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
    fabric: { ...GPUS_1024, uplinksPerRack: 16 },
    mix: "paper",
    loads: PAPER_LOADS,
    jobs: 1000,
    systems: SYSTEMS_2TIER,
    queueInMoves: "hold",
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
