import { expandHostlist } from "../../planner/model/hostlist.ts";

/**
 * What a process started by `srun` learns from Slurm's environment: its job, the node it runs
 * on, and the job's whole allocation. `monkeytree launch` takes its identity from it, so under
 * srun it needs no flags.
 */

export interface SlurmTask {
  /** SLURM_JOB_ID: the job's id, which is also its MonkeyTree job id. */
  readonly job: string;
  /** SLURMD_NODENAME: the node this task runs on. */
  readonly node: string;
  /** SLURM_JOB_NODELIST, expanded: every node of the job's allocation, in Slurm's order. */
  readonly nodes: readonly string[];
}

/** A Slurm environment that is there but cannot be read; the message names the variable. */
export class SlurmEnvironmentError extends Error {
  override readonly name = "SlurmEnvironmentError";
  readonly code = "invalid_slurm_environment";
}

/** The task's identity, or null outside a Slurm job. */
export function slurmTask(env: NodeJS.ProcessEnv): SlurmTask | null {
  const job = env.SLURM_JOB_ID;
  if (job === undefined || job === "") return null;
  if (!/^\d+$/.test(job)) throw new SlurmEnvironmentError(`SLURM_JOB_ID is "${job.slice(0, 40)}", not a job number`);
  const node = env.SLURMD_NODENAME;
  if (node === undefined || node === "")
    throw new SlurmEnvironmentError("SLURM_JOB_ID is set but SLURMD_NODENAME is not: run monkeytree launch through srun, one task per node");
  const list = env.SLURM_JOB_NODELIST ?? env.SLURM_NODELIST;
  if (list === undefined || list === "")
    throw new SlurmEnvironmentError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not: run monkeytree launch through srun");
  let nodes: string[];
  try {
    nodes = expandHostlist(list);
  } catch (error) {
    throw new SlurmEnvironmentError(`SLURM_JOB_NODELIST: ${(error as Error).message}`);
  }
  if (!nodes.includes(node)) throw new SlurmEnvironmentError(`SLURMD_NODENAME ${node} is not in SLURM_JOB_NODELIST ${list.slice(0, 80)}`);
  return { job, node, nodes };
}
