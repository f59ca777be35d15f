import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { localRendezvous } from "../helpers/net.ts";
import { PYTHON } from "../helpers/python.ts";

export const TRAIN = "examples/ddp/train.py";

/**
 * The digest of an unmigrated run of the example DDP job: plain torchrun, two processes, the
 * same seed and steps, its result written under `dir`. A migrated run must end bit-identical.
 */
export async function referenceDigest(steps: number, dir: string): Promise<string> {
  const out = join(dir, "reference.json");
  const run = spawnSync(PYTHON, ["-m", "torch.distributed.run", ...(await localRendezvous()), "--nproc_per_node", "2", TRAIN, "--steps", String(steps), "--out", out], {
    env: { ...process.env, PYTHONPATH: "sdk/python", OMP_NUM_THREADS: "1" },
    encoding: "utf8",
  });
  if (run.status !== 0) throw new Error(`reference run failed: ${run.stderr}`);
  return (JSON.parse(readFileSync(out, "utf8")) as { digest: string }).digest;
}
