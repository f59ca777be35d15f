import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { localRendezvous } from "../helpers/net.ts";
import { TORCHRUN } from "../helpers/python.ts";

/** What an example writes to --out when training ends. */
export interface TrainResult {
  step: number;
  worldSize: number;
  generation: number;
  digest: string;
}

/**
 * The result of an unmigrated run of `script`: plain torchrun on this machine with every
 * process of the job (`processes`), the same arguments, written under `dir`. A migrated run
 * must end with the same digest, bit for bit.
 */
export async function referenceRun(script: string, processes: number, args: readonly string[], dir: string): Promise<TrainResult> {
  const out = join(dir, `reference-${processes}-${script.replaceAll("/", "_")}.json`);
  const [program, ...torchrun] = TORCHRUN;
  const run = spawnSync(program!, [...torchrun, ...(await localRendezvous()), "--nproc_per_node", String(processes), script, ...args, "--out", out], {
    env: { ...process.env, PYTHONPATH: "sdk/python", OMP_NUM_THREADS: "1" },
    encoding: "utf8",
  });
  if (run.status !== 0) throw new Error(`reference run of ${script} failed (${run.status}): ${run.stderr}`);
  return JSON.parse(readFileSync(out, "utf8")) as TrainResult;
}
