import { rackFragmentation, withinBounds } from "../planner/model/fragmentation.ts";
import { routeCluster } from "../planner/route/index.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import type { StatusReport } from "../../sdk/contract/protocol/status.ts";
import { jobHosts } from "./assignment.ts";
import { pinnedJobs } from "./scheduler-watch.ts";
import { clusterOf, type DurableState } from "./state.ts";
import type { SchedulerView } from "./transport.ts";

/** How far a job has trained, from its launchers' reports. */
export interface JobProgress {
  /** The furthest barrier a host reported. */
  readonly step: number;
  /** The slowest host's recent step time; null until one reported it. */
  readonly stepSeconds: number | null;
}

/** What the controller knows beyond its durable state: who is connected right now. */
export interface LiveView {
  readonly state: DurableState;
  /** Jobs still waiting for some of their workers to register. */
  readonly registering: readonly { readonly id: string; readonly hosts: readonly number[]; readonly expected: number }[];
  readonly workers: number;
  /** The hosts whose worker is lost, by job: its launcher heartbeated, then fell silent. */
  readonly lost: ReadonlyMap<string, readonly number[]>;
  /** Jobs whose launchers reported a step, by job. */
  readonly progress: ReadonlyMap<string, JobProgress>;
  readonly daemons: readonly { readonly host: number; readonly lost: boolean }[];
  readonly journalRecords: number;
  /** The cluster scheduler's latest view, when one owns the hosts. */
  readonly scheduler: SchedulerView | null;
}

/** The `status.report` answer: placement, bounds, routing and the latest plan's moves. */
export function statusReport(id: number, view: LiveView): StatusReport {
  const { state } = view;
  const pinned = pinnedJobs(state, view.scheduler);
  const cluster = clusterOf(state, pinned);
  // Groups are kept in ring order, so routing keeps the orders the workers rank by.
  const routes = routeCluster(cluster, { previousOrders: cluster.placement });
  const started = [...state.jobs.values()].map((job) => {
    const lost = view.lost.get(job.id) ?? [];
    const progress = view.progress.get(job.id);
    return {
      id: job.id,
      hosts: jobHosts(job),
      expected: job.parallelism.pp * job.parallelism.dp,
      started: true,
      generation: job.generation,
      ...(progress ? { step: progress.step, stepSeconds: progress.stepSeconds } : {}),
      ...(lost.length ? { lost: [...lost].sort((a, b) => a - b) } : {}),
    };
  });
  const registering = view.registering.map((job) => ({
    id: job.id,
    hosts: [...job.hosts].sort((a, b) => a - b),
    expected: job.expected,
    started: false,
    generation: 0,
  }));
  const { racks, hostsPerRack, gpusPerHost, uplinksPerRack } = state.topology;
  return {
    v: PROTOCOL_VERSION,
    type: "status.report",
    id,
    topology: { racks, hostsPerRack, gpusPerHost, uplinksPerRack },
    lambda: state.lambda,
    jobs: [...started, ...registering].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)),
    workers: view.workers,
    hosts: {
      registered: view.daemons.length,
      lost: view.daemons
        .filter((d) => d.lost)
        .map((d) => d.host)
        .sort((a, b) => a - b),
    },
    fragmentation: rackFragmentation(cluster),
    withinBounds: withinBounds(cluster),
    routes: { isolated: routes.isolated, dpFlows: routes.dpFlows.length, maxFlowsPerLink: routes.overlap.maxFlowsPerLink },
    migrations: state.activeMoves
      .flatMap((moveId) => state.migrations.get(moveId) ?? [])
      .map((m) => ({
        id: m.id,
        job: m.job,
        group: m.group,
        from: m.from,
        to: m.to,
        planStep: m.planStep,
        state: m.state,
        stopStep: m.stopStep,
        reason: m.reason,
        history: [...m.history],
      })),
    journalRecords: view.journalRecords,
    ...(view.scheduler
      ? {
          scheduler: {
            pinned: pinned.map((job) => ({ id: job.id, rings: job.rings ?? 1, hosts: [...(job.hosts ?? [])] })),
            unavailable: view.scheduler.unavailable.map((u) => ({ host: u.host, why: u.why })),
            holds: view.scheduler.holds.map((h) => ({ name: h.name, job: h.job, node: h.node })),
          },
        }
      : {}),
  };
}
