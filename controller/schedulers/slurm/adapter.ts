import type { Logger } from "../../../sdk/contract/log.ts";
import { hostName, type NamedTopology } from "../../planner/model/named-topology.ts";
import { HOLD_PREFIX, holdJob, holdName, SlurmCommandError, type Slurm } from "./commands.ts";
import type { SlurmJob } from "./reports.ts";
import { slurmView, type CommentPolicy, type SlurmView } from "./view.ts";

/**
 * The Slurm adapter: what Slurm says of nodes and jobs, turned into the planner's inputs
 * (`slurmView`), and the two changes MonkeyTree makes to Slurm's books around a move.
 *
 * - Before a move starts, its destination is **held**: a reservation with IGNORE_JOBS for the
 *   job's user, so Slurm starts nothing else there while the moved worker runs on a node its
 *   job was never allocated (Slurm 22.05 cannot grow a running job).
 * - After the move commits, the vacated source is **given back**: the job's allocation shrinks
 *   to the nodes it keeps, and the source turns idle for Slurm to use.
 *
 * Holds live in Slurm, which saves reservations across its restarts, under names that say the
 * job they serve (`holdName`); every poll releases the holds of jobs that no longer run, so a
 * job's end, its cancellation, or this process's restart leaves no node held for nothing.
 */

export interface Hold {
  readonly name: string;
  readonly job: string;
  readonly node: string;
  /** The node's global index; null for a node outside the topology. */
  readonly host: number | null;
}

export interface AdapterState extends SlurmView {
  readonly holds: readonly Hold[];
  readonly jobs: readonly SlurmJob[];
  /** Ids of the jobs that still run or wait. */
  readonly live: readonly string[];
  /** The hosts of each live job's allocation, in the topology. */
  readonly allocations: readonly { readonly job: string; readonly hosts: readonly number[] }[];
}

/** What Slurm holds does not allow a hold or a give-back; the message says why and what happens instead. */
export class SlurmStateError extends Error {
  override readonly name = "SlurmStateError";
  readonly code = "slurm_state";
}

export interface AdapterOptions {
  readonly slurm: Slurm;
  readonly topology: NamedTopology;
  /** Slurm job ids whose workers registered with MonkeyTree. */
  readonly managed: () => ReadonlySet<string>;
  readonly log: Logger;
  /** How pinned jobs' `monkeytree:rings=N` comments count (default `bounded`). */
  readonly comments?: CommentPolicy;
}

/** Job states in which a job still has its nodes; a hold for a job in any other state is stale. */
const LIVE = new Set(["PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STOPPED", "RESIZING", "REQUEUED", "SIGNALING", "STAGE_OUT"]);

export class SlurmAdapter {
  constructor(private readonly options: AdapterOptions) {}

  /**
   * One look at Slurm: nodes, jobs and MonkeyTree's holds. Holds of jobs that ended are
   * released first, so the view never counts them; with `release` false (a look that must
   * change nothing) they are left, and count as any other reservation.
   */
  async poll(release = true): Promise<AdapterState> {
    const { slurm, topology } = this.options;
    const [nodes, jobs, reservations] = await Promise.all([slurm.nodes(), slurm.jobs(), slurm.reservations()]);
    const live = new Set(jobs.filter((job) => LIVE.has(job.state)).map((job) => job.id));
    const holds: Hold[] = [];
    const reserved = new Map<string, string>();
    for (const r of reservations) {
      const job = r.name.startsWith(HOLD_PREFIX) ? holdJob(r.name) : null;
      if (job !== null && live.has(job)) {
        for (const node of r.nodes) holds.push({ name: r.name, job, node, host: topology.hostIndex.get(node) ?? null });
      } else if (r.name.startsWith(HOLD_PREFIX) && release) {
        this.options.log.info(() => `releasing hold ${r.name} on ${r.nodes.join(",")}: ${job === null ? "it names no job" : `Slurm job ${job} ended`}`);
        await slurm.release(r.name);
      } else {
        for (const node of r.nodes) reserved.set(node, r.name);
      }
    }
    const view = slurmView({
      topology,
      nodes,
      jobs,
      managed: this.options.managed(),
      held: new Set(holds.map((h) => h.node)),
      reserved,
      comments: this.options.comments ?? "bounded",
    });
    const allocations = jobs
      .filter((job) => live.has(job.id))
      .map((job) => ({ job: job.id, hosts: job.nodes.flatMap((node) => topology.hostIndex.get(node) ?? []) }));
    return { ...view, holds, jobs, live: [...live], allocations };
  }

  /** The controller's regular look: `poll`, releasing the holds of ended jobs. */
  view(): Promise<AdapterState> {
    return this.poll(true);
  }

  /** Holds host `host` for Slurm job `job`'s migration `migration`, for the job's user, whom it names. */
  async hold(job: string, migration: string, host: number): Promise<Hold & { readonly user: string | null }> {
    const { slurm, topology } = this.options;
    const node = hostName(topology, host);
    const entry = (await slurm.jobs()).find((j) => j.id === job);
    if (!entry || !LIVE.has(entry.state)) throw new SlurmStateError(`Slurm job ${job} is not running, so nothing is held for it`);
    const name = holdName(job, migration);
    await slurm.hold(name, node, entry.user || "root");
    this.options.log.info(() => `holding ${node} for Slurm job ${job} (${name})`);
    // No replacement runs as root: a root job's gets the daemon's --run-as user.
    return { name, job, node, host, user: entry.user && entry.user !== "root" ? entry.user : null };
  }

  /** Ends the hold of `job`'s migration `migration`: the move rolled back, or the worker left. */
  async release(job: string, migration: string): Promise<void> {
    await this.options.slurm.release(holdName(job, migration));
  }

  /**
   * Gives host `host` back to Slurm once `job`'s worker moved off it: the allocation shrinks
   * to its other nodes, and the node turns idle.
   *
   * @throws SlurmStateError when `host` is the job's batch host (Slurm cannot drop it: the node
   *   stays allocated to the job, unused), not in its allocation, or the job was shrunk before
   *   on a Slurm without slurmdbd (which allows one resize per job)
   */
  async giveBack(job: string, host: number): Promise<void> {
    const { slurm, topology } = this.options;
    const node = hostName(topology, host);
    const entry = (await slurm.jobs()).find((j) => j.id === job);
    if (!entry || !entry.nodes.includes(node)) throw new SlurmStateError(`${node} is not allocated to Slurm job ${job}; nothing to give back`);
    if (entry.batchHost === node)
      throw new SlurmStateError(
        `${node} is Slurm job ${job}'s batch host, which Slurm cannot drop from a running job; it stays allocated to the job until it ends`,
      );
    try {
      await slurm.shrink(
        job,
        entry.nodes.filter((n) => n !== node),
      );
    } catch (error) {
      // A resize leaves the job waiting for a database index that only slurmdbd assigns.
      if (error instanceof SlurmCommandError && error.detail.includes("DB index is being set")) {
        throw new SlurmStateError(
          `Slurm refuses to shrink job ${job} again: without slurmdbd, Slurm 22.05 accepts one resize of a running job and refuses every later update of it ("${error.detail}"); ${node} stays allocated to the job until it ends`,
        );
      }
      throw error;
    }
    this.options.log.info(() => `gave ${node} back to Slurm: job ${job} now holds ${entry.nodes.filter((n) => n !== node).join(",")}`);
  }
}
