import type { FabricShape } from "./fabric.ts";
import type { SystemName } from "./simulate.ts";
import { SYSTEMS } from "./simulate.ts";
import type { Mix } from "./workload.ts";

/** A named experiment: the fabric, MonkeyTree's bound, and the traces to generate. */
export interface Preset {
  readonly description: string;
  readonly fabric: FabricShape;
  readonly lambda?: number;
  readonly mix: Mix;
  readonly loads: readonly number[];
  readonly jobs: number;
  readonly meanHours: number;
  readonly systems: readonly SystemName[];
  /** Expert-parallel all-to-all bytes per host as a multiple of its DP ring bytes. */
  readonly epFactor?: number;
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
    systems: SYSTEMS,
  },
  "paper-1024-dp": {
    description: "§7.7: 1,024 GPUs, 4 uplinks per rack (16:1), DP/FSDP jobs only, λ = 4",
    fabric: { ...GPUS_1024, uplinksPerRack: 4 },
    mix: "dp",
    loads: PAPER_LOADS,
    jobs: 1200,
    meanHours: 2,
    systems: SYSTEMS,
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
  "paper-ep": {
    description: "§7.10: 1,024 GPUs, 16 uplinks per rack, every job EP-dominated (10× more all-to-all than ring bytes), 100 jobs per load after 50 that fill the cluster",
    fabric: { ...GPUS_1024, uplinksPerRack: 16 },
    mix: "tp8pp",
    loads: PAPER_LOADS,
    jobs: 100,
    meanHours: 2,
    systems: SYSTEMS,
    epFactor: 10,
    warmupJobs: 50,
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
