import type { Assignment } from "../../sdk/contract/protocol/worker.ts";
import type { Migration } from "./migration.ts";
import { commitMove, type DurableState, type JobState } from "./state.ts";

/** A worker's node rank and its job's node count: what decides its share of a sharded model. */
export type Place = Pick<Assignment, "nodeRank" | "nodes">;

/**
 * A worker's place in its job. Node ranks follow the groups' ring orders, stage by stage, so
 * each rack's hosts hold consecutive ranks and every DP ring crosses a rack boundary once in
 * each direction. Null when the host runs no worker of the job. `addressOf` names a host on
 * the network (the controller uses the address its daemon advertises).
 */
export function assignmentOf(job: JobState, host: number, addressOf: (host: number) => string | null = () => null): Assignment | null {
  let before = 0;
  for (let g = 0; g < job.groups.length; g++) {
    const order = job.groups[g] ?? [];
    const position = order.indexOf(host);
    if (position >= 0) {
      return {
        job: job.id,
        group: g,
        host,
        nodeRank: before + position,
        nodes: job.groups.reduce((n, hosts) => n + hosts.length, 0),
        masterHost: job.groups[0]?.[0] ?? host,
        masterAddress: addressOf(job.groups[0]?.[0] ?? host),
        ringOrder: [...order],
        generation: job.generation,
        resumeStep: job.resumeStep,
      };
    }
    before += order.length;
  }
  return null;
}

/** Where the worker `m` moves will sit in its job once `m` commits, as things stand; null when its job is gone. */
export function placeAfter(state: DurableState, m: Migration): Place | null {
  const job = commitMove(state, m).get(m.job);
  return job ? placeOf(job, m.to) : null;
}

/** The place of the job's worker on `host`; null when the host runs none. */
export function placeOf(job: JobState, host: number): Place | null {
  const a = assignmentOf(job, host);
  return a && { nodeRank: a.nodeRank, nodes: a.nodes };
}

export const jobHosts = (job: Pick<JobState, "groups">): number[] => job.groups.flat();
