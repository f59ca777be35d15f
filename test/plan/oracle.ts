import { parseSnapshot, type Cluster, type Placement } from "../../controller/planner/model/index.ts";
import type { Move } from "../../controller/planner/plan/index.ts";
import { Random } from "../../controller/simulator/random.ts";

/**
 * A brute-force oracle for the planner that shares none of its code: racks, pods and
 * fragmentation are recomputed here from the snapshot's definitions (rack r holds hosts
 * r·H … r·H+H−1; a group spanning two or more racks adds its rings to each of them).
 *
 * Pinned jobs (`movable: false`) keep their placement. Unavailable hosts are never a
 * destination; a worker on one may stay, so a rack holds its groups' workers up to its
 * available hosts plus the unavailable hosts still occupied by the group already there. A
 * rack or pod whose pinned jobs alone fragment it past λ is held to that floor instead.
 */

interface Domains {
  readonly racks: number;
  readonly hostsPerRack: number;
  /** Pod of each rack; all 0 when there is no pod bound. */
  readonly podOf: readonly number[];
  readonly pods: number;
  /** Per rack and per pod: λ, or the pinned jobs' own degree where that is higher. */
  readonly lambda: readonly number[];
  readonly podLambda: readonly number[];
  /** Hosts per rack that are not unavailable. */
  readonly available: readonly number[];
}

function domainsOf(cluster: Cluster): Domains {
  const { racks, hostsPerRack, racksPerPod } = cluster.topology;
  const podded = cluster.podLambda !== undefined && racksPerPod !== undefined;
  const podOf = Array.from({ length: racks }, (_, t) => (podded ? Math.floor(t / racksPerPod) : 0));
  const pods = podded ? racks / racksPerPod : 1;
  const pinned = cluster.placement.map((hosts, g) => (cluster.groups[g]!.movable ? [] : hosts));
  const floors = degrees(cluster, pinned, hostsPerRack, racks, podOf, pods);
  const podLambda = podded ? cluster.podLambda! : Number.POSITIVE_INFINITY;
  return {
    racks,
    hostsPerRack,
    podOf,
    pods,
    lambda: floors.rack.map((f) => Math.max(f, cluster.lambda)),
    podLambda: floors.pod.map((f) => Math.max(f, podLambda)),
    available: Array.from({ length: racks }, (_, t) => hostsPerRack - cluster.unavailable.filter((h) => Math.floor(h / hostsPerRack) === t).length),
  };
}

function degrees(cluster: Cluster, placement: Placement, hostsPerRack: number, racks: number, podOf: readonly number[], pods: number) {
  const rack = new Array<number>(racks).fill(0);
  const pod = new Array<number>(pods).fill(0);
  placement.forEach((hosts, g) => {
    const spanned = [...new Set(hosts.map((h) => Math.floor(h / hostsPerRack)))];
    const podsSpanned = [...new Set(spanned.map((t) => podOf[t]!))];
    const rings = cluster.groups[g]!.rings;
    if (spanned.length > 1) for (const t of spanned) rack[t]! += rings;
    if (podsSpanned.length > 1) for (const p of podsSpanned) pod[p]! += rings;
  });
  return { rack, pod };
}

/** One way to spread a group over the racks, and what it costs and adds. */
interface Spread {
  readonly counts: readonly number[];
  /** Available hosts it takes on each rack: its workers there less those staying on unavailable hosts. */
  readonly uses: readonly number[];
  /** Workers that leave a rack: the moves this spread takes. */
  readonly cost: number;
  readonly racks: readonly number[];
  /** Pods it spans when it spans two or more (its rings count there), else none. */
  readonly pods: readonly number[];
}

function spreadsOf(shape: Domains, initial: readonly number[], held: readonly number[], movable: boolean): Spread[] {
  const size = initial.reduce((a, b) => a + b, 0);
  const out: Spread[] = [];
  const counts = new Array<number>(shape.racks).fill(0);
  const visit = (t: number, left: number) => {
    if (t === shape.racks - 1) {
      if (left > shape.hostsPerRack) return;
      counts[t] = left;
      if (!movable && counts.some((c, u) => c !== initial[u])) return;
      const racks = counts.flatMap((c, u) => (c > 0 ? [u] : []));
      const pods = [...new Set(racks.map((u) => shape.podOf[u]!))];
      out.push({
        counts: [...counts],
        uses: counts.map((c, u) => Math.max(0, c - held[u]!)),
        cost: counts.reduce((sum, c, u) => sum + Math.max(0, initial[u]! - c), 0),
        racks: racks.length > 1 ? racks : [],
        pods: pods.length > 1 ? pods : [],
      });
      return;
    }
    for (let c = Math.min(left, shape.hostsPerRack); c >= 0; c--) {
      counts[t] = c;
      visit(t + 1, left - c);
    }
  };
  visit(0, size);
  return out.sort((a, b) => a.cost - b.cost);
}

function initialCounts(cluster: Cluster, shape: Domains, only: (host: number) => boolean = () => true): number[][] {
  return cluster.placement.map((hosts) => {
    const counts = new Array<number>(shape.racks).fill(0);
    for (const h of hosts) if (only(h)) counts[Math.floor(h / shape.hostsPerRack)]! += 1;
    return counts;
  });
}

/**
 * What both searches below share: every group's spreads (cheapest first), the hosts still free
 * per rack, each rack's and pod's degree so far, and placing or lifting one group's spread.
 */
function placementSearch(cluster: Cluster) {
  const shape = domainsOf(cluster);
  const initial = initialCounts(cluster, shape);
  const held = initialCounts(cluster, shape, (h) => cluster.unavailable.includes(h));
  const options = initial.map((counts, g) => spreadsOf(shape, counts, held[g]!, cluster.groups[g]!.movable));
  const free = [...shape.available];
  const rackDegree = new Array<number>(shape.racks).fill(0);
  const podDegree = new Array<number>(shape.pods).fill(0);
  const ringsOf = (g: number) => cluster.groups[g]!.rings;
  return {
    shape,
    options,
    rackDegree,
    /** Whether group g's spread fits the free hosts and the pod bounds, and the rack bounds when `racksBound`. */
    fits(g: number, spread: Spread, racksBound: boolean): boolean {
      const r = ringsOf(g);
      return (
        spread.uses.every((c, t) => c <= free[t]!) &&
        (!racksBound || spread.racks.every((t) => rackDegree[t]! + r <= shape.lambda[t]!)) &&
        spread.pods.every((p) => podDegree[p]! + r <= shape.podLambda[p]!)
      );
    },
    /** Places (sign 1) or lifts (sign -1) group g's spread. */
    apply(g: number, spread: Spread, sign: 1 | -1): void {
      const r = sign * ringsOf(g);
      spread.uses.forEach((c, t) => (free[t]! -= sign * c));
      for (const t of spread.racks) rackDegree[t]! += r;
      for (const p of spread.pods) podDegree[p]! += r;
    },
  };
}

/**
 * The fewest worker moves to any placement that keeps every rack within capacity and every
 * rack and pod within its bound; Infinity when no placement does. Groups are placed one at a
 * time, each trying its spreads cheapest first; a partial placement is abandoned once it costs
 * as much as the best found or breaks a bound (fragmentation only grows as groups are added).
 */
export function minimumMoves(cluster: Cluster): number {
  const search = placementSearch(cluster);
  let best = Number.POSITIVE_INFINITY;
  const place = (g: number, moved: number) => {
    if (g === search.options.length) {
      best = moved;
      return;
    }
    for (const spread of search.options[g]!) {
      if (moved + spread.cost >= best) return;
      if (!search.fits(g, spread, true)) continue;
      search.apply(g, spread, 1);
      place(g + 1, moved + spread.cost);
      search.apply(g, spread, -1);
    }
  };
  place(0, 0);
  return best;
}

/**
 * The best effort when no placement meets every bound: the least fragmentation over the rack
 * bounds, summed over racks, then the fewest moves for it (pod bounds and capacity still hold).
 * `excess` is 0 exactly when `minimumMoves` is finite; Infinity for both when even that fails.
 */
export function bestEffortMinimum(cluster: Cluster): { excess: number; moves: number } {
  const search = placementSearch(cluster);
  const excess = () => search.rackDegree.reduce((sum, d, t) => sum + Math.max(0, d - search.shape.lambda[t]!), 0);
  let best = { excess: Number.POSITIVE_INFINITY, moves: Number.POSITIVE_INFINITY };
  const place = (g: number, moved: number) => {
    const over = excess();
    if (over > best.excess) return;
    if (g === search.options.length) {
      if (over < best.excess || moved < best.moves) best = { excess: over, moves: moved };
      return;
    }
    for (const spread of search.options[g]!) {
      // Excess never falls as groups are added, and spreads come cheapest first.
      if (over === best.excess && moved + spread.cost >= best.moves) return;
      if (!search.fits(g, spread, false)) continue;
      search.apply(g, spread, 1);
      place(g + 1, moved + spread.cost);
      search.apply(g, spread, -1);
    }
  };
  place(0, 0);
  return best;
}

/**
 * Replays a plan step by step under the plan contract (a source runs its group when its step
 * starts; a destination is free then or vacated in the same step; no host takes two workers)
 * and returns why the result breaks a bound, moves a pinned job or lands on an unavailable
 * host, or undefined when the plan is valid.
 */
export function planDefect(cluster: Cluster, moves: readonly Move[]): string | undefined {
  const shape = domainsOf(cluster);
  const owner = new Map<number, string>();
  cluster.groups.forEach((group, g) => cluster.placement[g]!.forEach((h) => owner.set(h, `${group.job}/${group.index}`)));
  for (const step of [...new Set(moves.map((m) => m.step))].sort((a, b) => a - b)) {
    const batch = moves.filter((m) => m.step === step);
    const sources = new Set(batch.map((m) => m.from));
    const targets = new Set(batch.map((m) => m.to));
    if (sources.size < batch.length || targets.size < batch.length) return `step ${step} uses a host twice`;
    for (const m of batch) {
      if (owner.get(m.from) !== `${m.job}/${m.group}`) return `step ${step}: host ${m.from} does not run ${m.job}/${m.group}`;
      if (cluster.groups.some((g) => g.job === m.job && !g.movable)) return `step ${step}: job ${m.job} is pinned`;
      if (cluster.unavailable.includes(m.to)) return `step ${step}: host ${m.to} is unavailable`;
      if (m.to >= shape.racks * shape.hostsPerRack) return `step ${step}: host ${m.to} does not exist`;
      if (owner.has(m.to) && !sources.has(m.to)) return `step ${step}: host ${m.to} is busy`;
    }
    const landing = batch.map((m) => [m.to, owner.get(m.from)!] as const);
    for (const m of batch) owner.delete(m.from);
    for (const [h, group] of landing) owner.set(h, group);
  }
  const placement = cluster.groups.map((group) => [...owner].filter(([, g]) => g === `${group.job}/${group.index}`).map(([h]) => h));
  return boundDefect(cluster, placement);
}

/** Which rack or pod a placement leaves over its bound, or undefined when none. */
export function boundDefect(cluster: Cluster, placement: Placement): string | undefined {
  const shape = domainsOf(cluster);
  const { rack, pod } = degrees(cluster, placement, shape.hostsPerRack, shape.racks, shape.podOf, shape.pods);
  const overRack = rack.findIndex((d, t) => d > shape.lambda[t]!);
  if (overRack >= 0) return `rack ${overRack} has degree ${rack[overRack]} > λ = ${shape.lambda[overRack]}`;
  const overPod = pod.findIndex((d, p) => d > shape.podLambda[p]!);
  if (overPod >= 0) return `pod ${overPod} has degree ${pod[overPod]} > pod λ = ${shape.podLambda[overPod]}`;
  return undefined;
}

/** Racks whose pinned jobs alone fragment them past λ, with that degree. */
export function pinnedFloors(cluster: Cluster): { index: number; pinned: number }[] {
  const shape = domainsOf(cluster);
  return shape.lambda.flatMap((bound, index) => (bound > cluster.lambda ? [{ index, pinned: bound }] : []));
}

/**
 * A random cluster (see `candidate`) the oracle finds no placement for although every group
 * too large for a rack has rings within λ (so no single group rules a plan out), from the
 * first such candidate of `seed`'s sequence.
 */
export function infeasibleInstance(seed: number): Cluster {
  const random = new Random(seed);
  for (;;) {
    const cluster = candidate(random, false);
    const { hostsPerRack } = cluster.topology;
    const oneGroupRules = cluster.groups.some((g, i) => cluster.placement[i]!.length > hostsPerRack && g.rings > cluster.lambda);
    // HiGHS takes tens of seconds to prove larger ones infeasible (see the test).
    const small = cluster.hostCount <= 9;
    if (small && !oneGroupRules && minimumMoves(cluster) === Number.POSITIVE_INFINITY) return cluster;
  }
}

export interface HardInstance {
  readonly seed: number;
  readonly cluster: Cluster;
  /** The oracle's minimum: between 3 and 6 moves. */
  readonly minimum: number;
}

/**
 * A cluster that needs 3–6 moves, from the first candidate of `seed`'s sequence that does.
 * With `pods` the topology has two racks per pod and a pod bound.
 */
export function hardInstance(seed: number, pods = false): HardInstance {
  const random = new Random(seed);
  for (;;) {
    const cluster = candidate(random, pods);
    const minimum = minimumMoves(cluster);
    if (minimum >= 3 && minimum <= 6) return { seed, cluster, minimum };
  }
}

/**
 * A random cluster like `hardInstance`'s candidates, with about a third of its jobs pinned and
 * up to three hosts unavailable (holding workers or free); any minimum, Infinity included.
 */
export function pinnedInstance(seed: number): { cluster: Cluster; minimum: number } {
  const random = new Random(seed);
  const hostsPerRack = random.int(2, 4);
  const cluster = scatter(random, {
    racks: random.int(2, 4),
    hostsPerRack,
    largestGroup: hostsPerRack + 1,
    rings: [1, 1, 2],
    lambda: random.int(0, 2),
    pins: { share: 0.35, unavailable: 3 },
  });
  return { cluster, minimum: minimumMoves(cluster) };
}

/**
 * A 3-tier cluster, two racks per pod, in which some groups are larger than a pod: the case
 * of the planner's pod-level infeasibility rule.
 */
export function threeTierCluster(seed: number): Cluster {
  const random = new Random(seed);
  const hostsPerRack = random.int(2, 3);
  return scatter(random, {
    racks: random.choice([4, 6]),
    hostsPerRack,
    largestGroup: 2 * hostsPerRack + 2,
    rings: [1, 2, 3],
    lambda: random.int(2, 4),
    podLambda: random.int(0, 2),
  });
}

/**
 * Candidates for `hardInstance`: a dense cluster whose groups start packed host by host and
 * then lose a few workers to swaps of random hosts, the way arrivals and departures scatter
 * them, so that a handful of moves usually repairs it.
 */
function candidate(random: Random, pods: boolean): Cluster {
  const hostsPerRack = random.int(3, 4);
  return scatter(random, {
    racks: pods ? random.choice([4, 6]) : random.int(3, 5),
    hostsPerRack,
    largestGroup: hostsPerRack + 1,
    rings: [1, 1, 2],
    lambda: random.int(0, 2),
    ...(pods ? { podLambda: random.int(1, 2) } : {}),
  });
}

interface Recipe {
  readonly racks: number;
  readonly hostsPerRack: number;
  readonly largestGroup: number;
  /** Ring counts drawn from, uniformly. */
  readonly rings: readonly number[];
  readonly lambda: number;
  /** With two racks per pod. */
  readonly podLambda?: number;
  /** Chance that a job is pinned, and how many hosts (at most) are unavailable. */
  readonly pins?: { readonly share: number; readonly unavailable: number };
}

function scatter(random: Random, shape: Recipe): Cluster {
  const { racks, hostsPerRack } = shape;
  const hostCount = racks * hostsPerRack;
  const owner = new Array<number>(hostCount).fill(-1);
  const jobs: { id: string; rings: number; groups: number[][] }[] = [];
  const used = random.int(Math.ceil(hostCount * 0.6), hostCount - 1);
  for (let next = 0; next < used;) {
    const stages = random.float() < 0.2 ? 2 : 1;
    const groups: number[][] = [];
    for (let s = 0; s < stages && next < used; s++) {
      const size = Math.min(random.int(1, shape.largestGroup), used - next);
      groups.push([]);
      for (let k = 0; k < size; k++) owner[next++] = jobs.length * 2 + s;
    }
    jobs.push({ id: `j${jobs.length}`, rings: random.choice(shape.rings), groups });
  }
  for (let swaps = random.int(2, 4); swaps > 0; swaps--) {
    const a = random.int(0, hostCount - 1);
    const b = random.int(0, hostCount - 1);
    [owner[a], owner[b]] = [owner[b]!, owner[a]!];
  }
  owner.forEach((o, h) => {
    if (o >= 0) jobs[o >> 1]!.groups[o & 1]!.push(h);
  });
  const pods = shape.podLambda !== undefined;
  // Drawn last, so the recipes without pins keep the sequences their tests were tuned on.
  const pins = shape.pins;
  const pinned = pins ? jobs.map(() => random.float() < pins.share) : [];
  const unavailable = pins ? [...new Set(Array.from({ length: random.int(1, pins.unavailable) }, () => random.int(0, hostCount - 1)))] : [];
  return parseSnapshot({
    topology: { racks, hostsPerRack, gpusPerHost: 8, uplinksPerRack: 4, ...(pods ? { racksPerPod: 2 } : {}) },
    lambda: shape.lambda,
    ...(pods ? { podLambda: shape.podLambda } : {}),
    jobs: jobs.map((job, j) => (pinned[j] ? { ...job, movable: false } : job)),
    ...(pins ? { unavailable } : {}),
  });
}
