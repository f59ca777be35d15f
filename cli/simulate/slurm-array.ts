import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { shellCommand } from "../demo/processes.ts";
import { UsageError } from "../io.ts";
import { CLI } from "../paths.ts";

/**
 * `monkeytree simulate --slurm-array DIR`: a sweep too long for one machine (a preset's
 * variants × loads) as a Slurm job array on the cluster the user already has, one run per
 * task, each writing its JSON report as DIR/part-K.json, and a job that merges them
 * (`--merge`) into DIR/merged.json and the page DIR/report/index.html once every task
 * succeeded (`afterok`): a failed task leaves its log, and nothing half-merged.
 */

/** One task's run: the `simulate` flags that pick its part of the sweep. */
export type Task = readonly string[];

export interface Submitted {
  readonly script: string;
  readonly array: string;
  readonly merge: string;
}

/** The array job's script: each task runs its own `simulate` and keeps its report only once whole. */
export function arrayScript(dir: string, tasks: readonly Task[]): string {
  const cases = tasks.map((args, k) => {
    const part = join(dir, `part-${k}.json`);
    return `  ${k}) ${shellCommand([process.execPath, ...CLI, "simulate", ...args, "--json"])} > ${shellCommand([`${part}.tmp`])} && mv ${shellCommand([`${part}.tmp`, part])} ;;`;
  });
  return [
    "#!/bin/bash",
    `#SBATCH --job-name=monkeytree-simulate`,
    `#SBATCH --array=0-${tasks.length - 1}`,
    `#SBATCH --output=${join(dir, "task-%a.log")}`,
    "set -euo pipefail",
    'case "$SLURM_ARRAY_TASK_ID" in',
    ...cases,
    '  *) echo "no task $SLURM_ARRAY_TASK_ID in this array" >&2; exit 2 ;;',
    "esac",
    "",
  ].join("\n");
}

/** Writes DIR/array.sh and submits it and its merge with `sbatch`; `sbatchArgs` go to both. */
export function submitArray(directory: string, tasks: readonly Task[], sbatchArgs: readonly string[]): Submitted {
  const dir = resolve(directory);
  const script = join(dir, "array.sh");
  writeFileSync(script, arrayScript(dir, tasks), { mode: 0o755 });
  const array = sbatch([...sbatchArgs, script], script);
  const parts = tasks.map((_, k) => join(dir, `part-${k}.json`)).join(",");
  const merge = [process.execPath, ...CLI, "simulate", "--merge", parts, "--report", join(dir, "report"), "--json"];
  const wrap = `${shellCommand(merge)} > ${shellCommand([join(dir, "merged.json")])}`;
  const merged = sbatch(
    [
      ...sbatchArgs,
      "--job-name=monkeytree-merge",
      `--dependency=afterok:${array}`,
      "--kill-on-invalid-dep=yes",
      `--output=${join(dir, "merge.log")}`,
      "--wrap",
      wrap,
    ],
    script,
  );
  return { script, array, merge: merged };
}

/** `sbatch --parsable ARGS`: the job id, or why Slurm would not take it. */
function sbatch(args: readonly string[], script: string): string {
  const result = spawnSync("sbatch", ["--parsable", ...args], { encoding: "utf8" });
  if (result.error)
    throw new UsageError(`--slurm-array: cannot run sbatch (${result.error.message}); run this on a Slurm login node, or submit ${script} yourself`);
  if (result.status !== 0)
    throw new UsageError(
      `--slurm-array: sbatch refused the job: ${result.stderr.trim() || `exit ${result.status}`}; ${script} is written, fix the cause or submit it yourself`,
    );
  return result.stdout.trim().split(";")[0]!;
}
