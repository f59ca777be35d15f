/** One example job (examples/<dir, or else name>/train.py) and the cluster it runs on. */
export interface ExampleJob {
  readonly name: string;
  /** The folder of examples/ whose train.py it runs, when not its name. */
  readonly dir?: string;
  /** Arguments after the script (beyond --steps and --out). */
  readonly args?: readonly string[];
  readonly nproc: number;
  readonly parallelism: { readonly dp: number; readonly pp: number; readonly tp: number };
  readonly topology: { readonly racks: number; readonly hostsPerRack: number; readonly gpusPerHost: number; readonly uplinksPerRack: number };
  /** The example job's host for each (stage, DP position). */
  readonly hosts: readonly (readonly number[])[];
  /** The arriving job's hosts (one DP group) and its rings. */
  readonly other: { readonly hosts: readonly number[]; readonly tp: number };
  readonly checkpointBytes: number;
  /** Python packages the example imports beyond torch (sdk/python/requirements-dev.txt pins them). */
  readonly python?: readonly string[];
}

export const script = (job: ExampleJob): string => `examples/${job.dir ?? job.name}/train.py`;

/**
 * The example jobs as the migration tests and bench:migrate run them, each on the smallest cluster where the
 * second job's arrival forces one of its hosts to move. Racks of two hosts, full once the
 * second job arrives: only a swap fixes them, and a swap moves one host of each job.
 */
const twoByTwo = { racks: 2, hostsPerRack: 2, gpusPerHost: 8 } as const;

/** Two hosts of two processes each, one in each rack, DP across them. */
const twoHostsDp = {
  nproc: 2,
  parallelism: { dp: 2, pp: 1, tp: 1 },
  topology: { ...twoByTwo, uplinksPerRack: 1 },
  hosts: [[0, 2]],
  other: { hosts: [1, 3], tp: 1 },
  checkpointBytes: 16 * 2 ** 20,
} as const;

export const EXAMPLE_JOBS: readonly ExampleJob[] = [
  // DDP, two processes per host: a host's two ranks stop, save, move and resume together.
  { name: "ddp", ...twoHostsDp },
  // FSDP2 over all four ranks: each process holds and moves only its own shards.
  { name: "fsdp", ...twoHostsDp },
  // TP = 2 inside each host: two rings cross each rack, within its two uplinks until the other job's third.
  { ...twoHostsDp, name: "tp", parallelism: { dp: 2, pp: 1, tp: 2 }, topology: { ...twoByTwo, uplinksPerRack: 2 } },
  // Two pipeline stages of two replicas, one group per stage, each inside a rack; the other job
  // (two rings) crosses the racks' single uplinks, and every fix swaps it with a stage's host.
  {
    name: "pp",
    nproc: 1,
    parallelism: { dp: 2, pp: 2, tp: 1 },
    topology: { racks: 2, hostsPerRack: 3, gpusPerHost: 8, uplinksPerRack: 1 },
    hosts: [
      [0, 1],
      [3, 4],
    ],
    other: { hosts: [2, 5], tp: 2 },
    checkpointBytes: 16 * 2 ** 20,
  },
  // The framework integrations: DDP and FSDP2 under a Lightning Trainer, DDP under a Hugging Face Trainer.
  { name: "lightning", ...twoHostsDp, python: ["lightning"] },
  { name: "lightning-fsdp", dir: "lightning", args: ["--fsdp"], ...twoHostsDp, python: ["lightning"] },
  { name: "transformers", ...twoHostsDp, python: ["transformers", "accelerate"] },
];
