// The fabric's side of a `simulateSystem` run: routing the running jobs' flows (`reroute`),
// sampling fragmentation as it does, and the max-min fair rates that set every job's pace and
// every checkpoint transfer's (`rerate`).
import { rackFragmentation } from "../planner/model/fragmentation.ts";
import type { Cluster } from "../planner/model/cluster.ts";
import { dpFlows, ppFlows } from "../planner/route/index.ts";
import type { Fabric } from "./fabric.ts";
import { iterationSeconds, type SimJob } from "./jobs.ts";
import { maxMinRates } from "./maxmin.ts";
import { choosePaths, ringRail } from "./routing.ts";
import { clusterOfRunning, type A2aFlow, type SimState, type Transfer } from "./simulate-state.ts";

/** Brings routes and rates up to date with the placement and the flows that changed since they were set. */
export function refreshRates(state: SimState): void {
  if (state.routesDirty) reroute(state);
  if (state.ratesDirty) rerate(state);
}

/** Routes the running jobs' flows as the system's routing does, then samples fragmentation. */
export function reroute(state: SimState): void {
  const { fabric, nic, running } = state;
  const { gpusPerHost } = state.config.fabric;
  const cluster = (state.cluster = clusterOfRunning(state));
  const dp = dpFlows(cluster, cluster.placement);
  const pp = ppFlows(cluster, cluster.placement);
  const a2a = allToAllFlows(cluster, (id) => running.get(id)!.job.a2aBytes > 0, gpusPerHost, fabric);
  const choice = choosePaths(state.spec.routing, cluster, dp, pp, a2a, {
    fabric,
    seed: state.config.seed,
    sglbK: state.config.sglbK,
    memo: state.memo,
    intensity: (id) => intensity(running.get(id)?.job, nic),
    share: (id) => {
      const job = running.get(id)!.job;
      return { dp: job.ringBytes > 0 ? 1 : 0, pp: ppDemand(job, nic) / nic };
    },
  });
  state.flows = { dp, pp, a2a };
  state.linksOf = {
    dp: dp.map((f, i) => fabric.route(f.srcRack, f.dstRack, ringRail(cluster, f, gpusPerHost), choice.dp[i]!)),
    pp: pp.map((f, i) => fabric.route(f.srcRack, f.dstRack, f.replica, choice.pp[i]!)),
    a2a: a2a.map((f, i) => fabric.route(f.srcRack, f.dstRack, f.nic, choice.other[i]!)),
  };
  state.routesDirty = false;
  state.ratesDirty = true;
  sample(state);
}

/** Records the cluster's fragmentation from now on, its peaks, and tells the observer. */
export function sample(state: SimState): void {
  const { cluster, fabric, fragmentation } = state;
  const degrees = rackFragmentation(cluster);
  const max = Math.max(0, ...degrees);
  const total = degrees.reduce((a, b) => a + b, 0);
  const fragmentedGroups = cluster.placement.filter((hosts) => new Set(hosts.map((h) => fabric.rackOf(h))).size > 1).length;
  fragmentation.current = { max, total, groups: fragmentedGroups };
  fragmentation.peakMaxRack = Math.max(fragmentation.peakMaxRack, max);
  fragmentation.peakTotal = Math.max(fragmentation.peakTotal, total);
  state.observer.sample?.({ time: state.now, maxRack: max, meanRack: total / Math.max(1, degrees.length), total, fragmentedGroups });
}

/**
 * The flows whose rates max-min fairness sets, as entities: each a path (the union of its
 * sub-flows' links) and a demand. Rings first, then pipeline flows, all-to-alls and transfers.
 */
export interface RateProblem {
  readonly paths: number[][];
  readonly demands: number[];
  /** Group g's ring k is entity firstRing[g] + k; -1: the group's rings cross no shared link. */
  readonly firstRing: Int32Array;
  /** Each job's pipeline flows' entities. */
  readonly ppEntities: Map<string, number[]>;
  /** Each group's all-to-all entity. */
  readonly a2aEntity: Map<number, number>;
  /** The checkpoint transfers in flight, entities `firstTransfer` on. */
  readonly transfers: Transfer[];
  readonly firstTransfer: number;
}

/** Sets every transfer's rate and every running job's iterations per second for the current routes. */
export function rerate(state: SimState): void {
  const problem = rateProblem(state);
  const solve = solver(state.fabric, problem);
  const rates = solve();
  problem.transfers.forEach((t, i) => (t.rate = rates[problem.firstTransfer + i]!));
  const { ringRate, a2aRate } = phaseRates(state, problem, rates, solve);
  const { nic } = state;
  const { gpusPerHost } = state.config.fabric;
  for (const r of state.running.values()) {
    if (r.paused) {
      r.rate = 0;
      continue;
    }
    // Pipeline flows inside a rack are held only by the NIC.
    const pp = Math.min(nic, ...(problem.ppEntities.get(r.job.id) ?? []).map((e) => rates[e]!));
    r.rate = 1 / iterationSeconds(r.job, { ring: ringRate.get(r.job.id) ?? Infinity, pp, a2a: a2aRate.get(r.job.id) ?? Infinity, host: nic * gpusPerHost });
  }
  state.ratesDirty = false;
}

/** The entities of the running jobs' flows over their current routes, and of the transfers in flight. */
export function rateProblem(state: SimState): RateProblem {
  const { cluster, running, nic, flows, linksOf } = state;
  const paths: number[][] = [];
  const demands: number[] = [];
  const firstRing = new Int32Array(cluster.groups.length).fill(-1);
  const ppEntities = new Map<string, number[]>();
  cluster.groups.forEach((group, g) => {
    const r = running.get(group.job)!;
    const hosts = cluster.placement[g]!;
    if (r.paused || hosts.length < 2 || r.job.ringBytes === 0) return;
    // A job's phases never overlap and hosts are not shared, so a NIC only bounds its
    // own flow: ring k sends once and receives once on NIC k of every host.
    firstRing[g] = paths.length;
    for (let ring = 0; ring < group.rings; ring++) {
      paths.push([]);
      demands.push(nic);
    }
  });
  flows.dp.forEach((f, i) => {
    if (firstRing[f.group] === -1) return;
    paths[firstRing[f.group]! + f.ring]!.push(...linksOf.dp[i]!);
  });
  flows.pp.forEach((f, i) => {
    const job = cluster.groups[f.fromGroup]!.job;
    const r = running.get(job)!;
    if (r.paused) return;
    // Pipeline transfers happen during compute, never beside the job's own all-reduce,
    // so they contend in the fabric only.
    const list = ppEntities.get(job) ?? [];
    list.push(paths.length);
    ppEntities.set(job, list);
    paths.push(linksOf.pp[i]!);
    demands.push(ppDemand(r.job, nic));
  });
  // A stage's all-to-all is one flow: every pair of its hosts on every NIC, in lockstep.
  const a2aEntity = new Map<number, number>();
  cluster.groups.forEach((group, g) => {
    const r = running.get(group.job)!;
    const hosts = cluster.placement[g]!;
    if (r.paused || hosts.length < 2 || r.job.a2aBytes === 0) return;
    // Every NIC sends to, and receives from, each of the other hosts once.
    a2aEntity.set(g, paths.length);
    paths.push([]);
    demands.push(nic / (hosts.length - 1));
  });
  flows.a2a.forEach((f, i) => {
    const entity = a2aEntity.get(f.group);
    if (entity === undefined) return;
    paths[entity]!.push(...linksOf.a2a[i]!);
  });
  const transfers = state.migrations.flatMap((m) => m.transfers);
  const firstTransfer = paths.length;
  for (const t of transfers) {
    paths.push(t.links);
    demands.push(Infinity);
  }
  return { paths, demands, firstRing, ppEntities, a2aEntity, transfers, firstTransfer };
}

/** Max-min fair rates of the problem's entities, optionally with some left out (they get 0 and take nothing). */
function solver(fabric: Fabric, { paths, demands }: RateProblem): (without?: readonly number[]) => Float64Array {
  return (without = []) => {
    if (paths.length === 0) return new Float64Array(0);
    if (without.length === 0) return maxMinRates({ capacities: fabric.capacities, flows: paths, demands });
    // A left-out flow crosses nothing and wants nothing.
    const gone = new Set(without);
    return maxMinRates({
      capacities: fabric.capacities,
      flows: paths.map((links, e) => (gone.has(e) ? [] : links)),
      demands: demands.map((d, e) => (gone.has(e) ? 0 : d)),
    });
  };
}

/**
 * Each job's all-reduce rate (its slowest ring's) and all-to-all rate (a host's, over every
 * other host of its stage and every NIC). A job's all-reduce and all-to-all take turns, so
 * each meets everyone's traffic but the other's: one solve without its all-to-all, one without
 * its rings. Where the other phase stays inside racks it crosses no shared link, and leaving it
 * out changes nothing.
 */
function phaseRates(state: SimState, problem: RateProblem, rates: Float64Array, solve: (without?: readonly number[]) => Float64Array) {
  const { cluster } = state;
  const { paths, firstRing, a2aEntity } = problem;
  const ringsOf = new Map<string, number[]>();
  cluster.groups.forEach((group, g) => {
    if (firstRing[g] === -1) return;
    const entities = ringsOf.get(group.job) ?? [];
    for (let ring = 0; ring < group.rings; ring++) entities.push(firstRing[g]! + ring);
    ringsOf.set(group.job, entities);
  });
  const a2aOf = new Map<string, number[]>();
  for (const [g, entity] of a2aEntity) a2aOf.set(cluster.groups[g]!.job, [...(a2aOf.get(cluster.groups[g]!.job) ?? []), entity]);
  const solveWithout = (own: readonly number[] | undefined) => (own?.some((e) => paths[e]!.length > 0) ? solve(own) : rates);
  const ringRate = new Map<string, number>();
  for (const [job, entities] of ringsOf) {
    const from = solveWithout(a2aOf.get(job));
    ringRate.set(job, Math.min(...entities.map((e) => from[e]!)));
  }
  // Each host sends to every other host of its stage on every NIC at the flow's rate.
  const a2aRate = new Map<string, number>();
  const sizeOf = new Map([...a2aEntity].map(([g, entity]) => [entity, cluster.placement[g]!.length]));
  for (const [job, entities] of a2aOf) {
    const from = solveWithout(ringsOf.get(job));
    a2aRate.set(job, Math.min(...entities.map((e) => from[e]! * (sizeOf.get(e)! - 1) * state.config.fabric.gpusPerHost)));
  }
  return { ringRate, a2aRate };
}

/** Every cross-rack sub-flow of the all-to-alls of the stages whose job has one. */
export function allToAllFlows(cluster: Cluster, hasAllToAll: (job: string) => boolean, nics: number, fabric: Fabric): A2aFlow[] {
  const flows: A2aFlow[] = [];
  cluster.groups.forEach((group, g) => {
    if (!hasAllToAll(group.job)) return;
    const hosts = cluster.placement[g]!;
    // A NIC sends to each of the stage's other hosts in turn: a 1/(n − 1) share of its speed.
    const share = 1 / Math.max(1, hosts.length - 1);
    for (const a of hosts) {
      for (const b of hosts) {
        const srcRack = fabric.rackOf(a);
        const dstRack = fabric.rackOf(b);
        if (srcRack === dstRack) continue;
        for (let k = 0; k < nics; k++)
          flows.push({ group: g, srcHost: a, dstHost: b, srcRack, dstRack, nic: k, key: `a2a/${group.job}/${group.index}/${a}>${b}/${k}`, share });
      }
    }
  });
  return flows;
}

/** The rate a job's pipeline flows want: what hides them behind compute, at most a NIC's speed. */
export function ppDemand(job: SimJob, nic: number): number {
  return job.computeSeconds > 0 ? Math.min(nic, job.ppBytes / job.computeSeconds) : nic;
}

/** Crux's intensity: GPU-seconds a byte of the job's all-reduce holds up. */
export function intensity(job: SimJob | undefined, nic: number): number {
  if (!job || job.ringBytes === 0) return 0;
  return (job.stages * job.hostsPerStage * (job.computeSeconds + job.ringBytes / nic)) / job.ringBytes;
}
