import type { Cluster } from "../planner/model/cluster.ts";
import { colourEdges, crc32HashModel, defaultAddressOf, EPHEMERAL_PORTS, ROCE_V2_PORT, type DpFlow, type PpFlow, type Tier } from "../planner/route/index.ts";
import { routePipelineFlows } from "../planner/route/paths.ts";
import { routeThreeTier } from "../planner/route/three-tier.ts";
import { routeTwoTier } from "../planner/route/two-tier.ts";
import type { Fabric } from "./fabric.ts";

/** How a system picks the path of each cross-rack flow. */
export const ROUTINGS = ["ecmp", "perfect", "crux", "sglb", "spray"] as const;
export type RoutingName = (typeof ROUTINGS)[number];

export interface RoutingContext {
  readonly fabric: Fabric;
  readonly seed: number;
  /** Crux's job intensity: GPU time its communication holds up per byte, higher first. */
  readonly intensity: (job: string) => number;
  /** SGLB's choice set: each flow takes one of the K spines that offer it the most. */
  readonly sglbK: number;
  /** The share of a link each of a job's DP and PP flows fills at most: its demand over the link's speed. */
  readonly share: (job: string) => { readonly dp: number; readonly pp: number };
  /** Flows kept from the routings before, for groups that have not moved since; none: built anew. */
  readonly memo?: RouteMemo;
}

/**
 * A cross-rack flow as the routings see it: its racks, its rail, the name its hash draws from
 * and the share of a link it fills. Given as such, it is one no controller routes (an
 * expert-parallel all-to-all's): ECMP hashes it, Perfect routing spreads it round-robin,
 * Crux and SGLB place it by load.
 */
export interface OtherFlow {
  readonly srcHost: number;
  readonly dstHost: number;
  readonly srcRack: number;
  readonly dstRack: number;
  /** The NIC it leaves on, which is its rail in a rail-optimised fabric. */
  readonly nic: number;
  readonly key: string;
  /** The share of a link it fills at most: its demand over the link's speed, in (0, 1]. */
  readonly share: number;
}

/**
 * For every DP, PP and other flow, in the order given, its choice at each hop of
 * `Fabric.hops` (the spine in a 2-tier Clos; aggregation switch, core switch and destination
 * aggregation switch between pods of a 3-tier one; the rail's uplink in a rail-optimised one).
 */
export interface PathChoice {
  readonly dp: number[][];
  readonly pp: number[][];
  readonly other: number[][];
}

/** A group's DP flows as the routings see them, and ECMP's choices for them once asked for. */
interface GroupFlows {
  readonly hosts: readonly number[];
  readonly rings: number;
  readonly share: number;
  readonly flows: readonly OtherFlow[];
  ecmp?: number[][];
}

/**
 * Each group's DP flows as the routings see them (their rails, the names their hashes draw
 * from, their shares) and ECMP's choices for them, kept from one routing to the next: they
 * depend on the group's name, rings, hosts and job alone, and a placement change moves few
 * groups, so the others are looked up instead of built and hashed again. One per simulated
 * system, since the seed is part of every ECMP choice.
 */
export class RouteMemo {
  #kept = new Map<string, GroupFlows>();
  #next = new Map<string, GroupFlows>();

  /** Group `g`'s flows, built from `dp` (its flows in `dpFlows`' order) unless kept for the same hosts, rings and share. */
  group(cluster: Cluster, g: number, dp: readonly DpFlow[], share: number): GroupFlows {
    const group = cluster.groups[g]!;
    const hosts = cluster.placement[g]!;
    const name = `${group.job}/${group.index}`;
    const kept = this.#kept.get(name);
    const same =
      kept !== undefined &&
      kept.flows.length === dp.length &&
      kept.rings === group.rings &&
      kept.share === share &&
      kept.hosts.length === hosts.length &&
      kept.hosts.every((h, i) => h === hosts[i]);
    const nics = cluster.topology.gpusPerHost;
    const entry = same
      ? kept
      : { hosts: [...hosts], rings: group.rings, share, flows: dp.map((f) => flowOf(f, ringRail(cluster, f, nics), dpKey(cluster, f), share)) };
    this.#next.set(name, entry);
    return entry;
  }

  /** Ends a routing: the groups it did not ask for are gone. */
  settle(): void {
    this.#kept = this.#next;
    this.#next = new Map();
  }
}

const flowOf = (f: DpFlow | PpFlow, nic: number, key: string, share: number): OtherFlow => ({
  srcHost: f.srcHost,
  dstHost: f.dstHost,
  srcRack: f.srcRack,
  dstRack: f.dstRack,
  nic,
  key,
  share,
});

const UDP = 17;
const hashModel = crc32HashModel();

/** FNV-1a of a string, mixed with a seed: the stand-in for how a NIC picks a queue pair's port. */
export function flowHash(key: string, seed: number): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** The ephemeral source port a flow's queue pair draws. */
export function sourcePort(key: string, seed: number): number {
  const span = EPHEMERAL_PORTS.last - EPHEMERAL_PORTS.first + 1;
  return EPHEMERAL_PORTS.first + (flowHash(key, seed) % span);
}

/**
 * The spine a ToR's ECMP hash sends a flow to: CRC-32 of the RoCEv2 5-tuple (the switch
 * model routing steers against), with a source port the flow's queue pair drew at random.
 */
export function ecmpSpine(srcHost: number, dstHost: number, key: string, seed: number, spines: number, tier: Tier = "tor"): number {
  const tuple = {
    srcAddress: defaultAddressOf(srcHost),
    dstAddress: defaultAddressOf(dstHost),
    protocol: UDP,
    srcPort: sourcePort(key, seed),
    dstPort: ROCE_V2_PORT,
  };
  return hashModel.select(tuple, spines, tier);
}

/** Every hop's ECMP choice for a flow, each switch tier hashing the same 5-tuple its own way. */
export function ecmpChoices(fabric: Fabric, f: { srcHost: number; dstHost: number }, key: string, seed: number): number[] {
  return fabric.hops(fabric.rackOf(f.srcHost), fabric.rackOf(f.dstHost)).map((hop) => ecmpSpine(f.srcHost, f.dstHost, key, seed, hop.members, hop.tier));
}

/**
 * The rail a DP ring runs on in a rail-optimised fabric: rail-aligned ranks keep ring k of a
 * TP job on NIC k of every host, so a job with a ring per NIC uses every rail once; a job with
 * fewer rings (DP/FSDP) starts at a rail drawn from its group's name, spreading such jobs.
 */
export function ringRail(cluster: Cluster, f: DpFlow, nics: number): number {
  const g = cluster.groups[f.group]!;
  return g.rings >= nics ? f.ring % nics : (f.ring + flowHash(`${g.job}/${g.index}`, 0)) % nics;
}

export const dpKey = (cluster: Cluster, f: DpFlow): string => {
  const g = cluster.groups[f.group]!;
  return `${g.job}/${g.index}/${f.ring}/${f.srcHost}>${f.dstHost}`;
};
export const ppKey = (cluster: Cluster, f: PpFlow): string => {
  const from = cluster.groups[f.fromGroup]!;
  const to = cluster.groups[f.toGroup]!;
  return `${from.job}/${from.index}>${to.index}/${f.replica}/${f.srcHost}>${f.dstHost}`;
};

export function choosePaths(
  name: RoutingName,
  cluster: Cluster,
  dp: readonly DpFlow[],
  pp: readonly PpFlow[],
  other: readonly OtherFlow[],
  context: RoutingContext,
): PathChoice {
  const nics = cluster.topology.gpusPerHost;
  const shares = new Map<number, { readonly dp: number; readonly pp: number }>();
  const shareOf = (g: number) => shares.get(g) ?? shares.set(g, context.share(cluster.groups[g]!.job)).get(g)!;
  // Built only for the routings that hash or weigh flows.
  const groups = () => dpGroups(cluster, dp, context.memo ?? new RouteMemo(), (g) => shareOf(g).dp);
  const dpFlows = () => groups().flatMap((group) => group.flows);
  const ppFlows = () => pp.map((f) => flowOf(f, f.replica % nics, ppKey(cluster, f), shareOf(f.fromGroup).pp));
  const hashed = (flows: readonly OtherFlow[]) => flows.map((f) => ecmpChoices(context.fabric, f, f.key, context.seed));
  switch (name) {
    case "spray":
      return { dp: dp.map(() => [0]), pp: pp.map(() => [0]), other: other.map(() => [0]) };
    case "ecmp":
      return { dp: groups().flatMap((group) => (group.ecmp ??= hashed(group.flows))), pp: hashed(ppFlows()), other: hashed(other) };
    case "perfect":
      return { ...perfect(cluster, dp, pp, context.fabric), other: roundRobin(other, context.fabric) };
    case "crux":
      return crux(cluster, dp, dpFlows(), ppFlows(), other, context);
    case "sglb":
      return sglb(dpFlows(), ppFlows(), other, context);
  }
}

/** Each group's flows of `dp` (in `dpFlows`' order: group by group), through `memo`. */
function dpGroups(cluster: Cluster, dp: readonly DpFlow[], memo: RouteMemo, share: (g: number) => number): GroupFlows[] {
  const groups: GroupFlows[] = [];
  for (let start = 0, end = 0; start < dp.length; start = end) {
    const g = dp[start]!.group;
    while (end < dp.length && dp[end]!.group === g) end++;
    groups.push(memo.group(cluster, g, dp.slice(start, end), share(g)));
  }
  memo.settle();
  return groups;
}

/**
 * The controller's routing. In a 2-tier Clos, as `monkeytree routes` computes it for the
 * cluster's ring orders. In a 3-tier one, its two-step colouring (`route/three-tier.ts`: each
 * pod with a virtual endpoint for inter-pod flows, then aggregation to core) with the
 * aggregation switches' real core-link count, and its round-robin pipeline routes. In a
 * rail-optimised one, rails share no links, so each rail is its own 2-tier Clos with
 * `uplinksPerRail` spines: the controller's 2-tier colouring on that rail's rings, and
 * pipeline flows round-robin over the rail's uplinks.
 */
function perfect(cluster: Cluster, dp: readonly DpFlow[], pp: readonly PpFlow[], fabric: Fabric): Omit<PathChoice, "other"> {
  const shape = fabric.shape;
  if (fabric.kind === "clos3") {
    const routed = routeThreeTier(cluster, dp, colourEdges, shape.aggUplinks!).paths;
    const hops = (p: { uplink: number; core: number | null; downlink: number }) =>
      p.core === null ? [p.uplink] : [p.uplink, p.core % shape.aggUplinks!, p.downlink];
    return { dp: routed.map(hops), pp: routePipelineFlows(cluster, pp).map(hops) };
  }
  if (fabric.kind === "rail") {
    const rail = { ...cluster, topology: { ...cluster.topology, uplinksPerRack: shape.uplinksPerRail! } };
    const choice: number[][] = dp.map(() => []);
    const rails = dp.map((f) => ringRail(cluster, f, cluster.topology.gpusPerHost));
    for (let r = 0; r < shape.gpusPerHost; r++) {
      const on = dp.flatMap((_, i) => (rails[i] === r ? [i] : []));
      routeTwoTier(
        rail,
        on.map((i) => dp[i]!),
        colourEdges,
      ).paths.forEach((p, k) => (choice[on[k]!] = [p.uplink]));
    }
    return { dp: choice, pp: routePipelineFlows(rail, pp).map((p) => [p.uplink]) };
  }
  // `routeCluster`'s paths for flows in ring order, without the source ports that would steer
  // them through real switches' hashing: the simulator places each flow on its path itself.
  return { dp: routeTwoTier(cluster, dp, colourEdges).paths.map((p) => [p.uplink]), pp: routePipelineFlows(cluster, pp).map((p) => [p.uplink]) };
}

/**
 * Perfect routing's way with flows it does not isolate (paper §5.4: other flows are spread
 * "round-robin across available spines"), as it spreads pipeline flows: each source rack (each
 * of its rails, in a rail-optimised fabric) hands its flows to the members of every hop in turn.
 */
function roundRobin(flows: readonly OtherFlow[], fabric: Fabric): number[][] {
  const next = new Map<string, number>();
  return flows.map((f) => {
    // A rail's uplinks are its own; a ToR's are shared by all of its hosts' NICs.
    const from = fabric.kind === "rail" ? `${f.srcRack}/${f.nic}` : `${f.srcRack}`;
    const n = next.get(from) ?? 0;
    next.set(from, n + 1);
    return fabric.hops(f.srcRack, f.dstRack).map((hop) => n % hop.members);
  });
}

/**
 * Load on every fabric link as a greedy router places flows hop by hop: the flows on each
 * link, and the share of it they want (their demands over its speed: a DP ring all of it, an
 * all-to-all sub-flow of n hosts 1/(n − 1), a ring that carries nothing none). At each switch
 * a flow goes where max-min fairness would give it the most on the links that choice adds:
 * the spare capacity of a link that is not full, an equal share of one that is, up to what it
 * wants; on ties, where less is wanted already, then the lower index. Counting flows alone
 * would put a ring beside mice that fit elsewhere; counting shares alone would pile mice onto
 * a full link, where each takes as much as a ring.
 */
class LinkLoads {
  readonly #wanted: Float64Array;
  readonly #flows: Float64Array;
  #rate = new Float64Array(0);
  #carried = new Float64Array(0);
  readonly #links: number[] = [];
  constructor(readonly fabric: Fabric) {
    this.#wanted = new Float64Array(fabric.capacities.length);
    this.#flows = new Float64Array(fabric.capacities.length);
  }
  /** The `k` best members of a hop for `f`, best first (found without sorting: this runs per flow). */
  #best(f: OtherFlow, choices: number[], hop: number, members: number, k: number): number[] {
    // Per member: what the flow would get there, and the most its links already carry.
    const rate = this.#rate.length >= members ? this.#rate : (this.#rate = new Float64Array(members));
    const carried = this.#carried.length >= members ? this.#carried : (this.#carried = new Float64Array(members));
    const links = this.#links;
    for (let c = 0; c < members; c++) {
      choices[hop] = c;
      rate[c] = f.share;
      carried[c] = 0;
      for (let i = 0, n = this.fabric.hopLinks(f.srcRack, f.dstRack, f.nic, choices, hop, links); i < n; i++) {
        const link = links[i]!;
        rate[c] = Math.min(rate[c]!, Math.max(1 - this.#wanted[link]!, 1 / (this.#flows[link]! + 1)));
        carried[c] = Math.max(carried[c]!, this.#wanted[link]!);
      }
    }
    const beats = (a: number, b: number) => rate[a]! > rate[b]! || (rate[a] === rate[b] && carried[a]! < carried[b]!);
    const picked: number[] = [];
    for (let c = 0; c < members; c++) {
      if (picked.length === k && !beats(c, picked[k - 1]!)) continue;
      let i = picked.length === k ? k - 1 : picked.length;
      for (; i > 0 && beats(c, picked[i - 1]!); i--) picked[i] = picked[i - 1]!;
      picked[i] = c;
    }
    return picked;
  }
  /** Picks every hop in turn with `pick` among its `k` best members, and counts the flow on its links. */
  place(f: OtherFlow, k: number, pick: (best: number[], hop: number) => number): number[] {
    const choices: number[] = [];
    this.fabric.hops(f.srcRack, f.dstRack).forEach((h, hop) => (choices[hop] = pick(this.#best(f, choices, hop, h.members, k), hop)));
    this.#count(f, choices, 1);
    return choices;
  }
  /** Takes a placed flow off its links. */
  remove(f: OtherFlow, choices: readonly number[]): void {
    this.#count(f, choices, -1);
  }
  #count(f: OtherFlow, choices: readonly number[], sign: 1 | -1): void {
    for (const link of this.fabric.route(f.srcRack, f.dstRack, f.nic, choices)) {
      this.#wanted[link]! += sign * f.share;
      if (f.share > 0) this.#flows[link]! += sign;
    }
  }
}

/**
 * Crux: jobs in decreasing intensity, each job's flows in turn on the path that offers it the
 * most so far, hop by hop (see LinkLoads). Greedy, so it can miss an isolating assignment that
 * exists. PP and other flows follow, spread the same way.
 */
function crux(
  cluster: Cluster,
  groups: readonly DpFlow[],
  dp: readonly OtherFlow[],
  pp: readonly OtherFlow[],
  other: readonly OtherFlow[],
  context: RoutingContext,
): PathChoice {
  const loads = new LinkLoads(context.fabric);
  const jobOf = (i: number) => cluster.groups[groups[i]!.group]!.job;
  const order = dp
    .map((_, i) => i)
    .sort((a, b) => {
      const ja = jobOf(a);
      const jb = jobOf(b);
      return context.intensity(jb) - context.intensity(ja) || (ja < jb ? -1 : ja > jb ? 1 : 0) || a - b;
    });
  const least = (f: OtherFlow) => loads.place(f, 1, (best) => best[0]!);
  const dpChoices: number[][] = dp.map(() => []);
  for (const i of order) dpChoices[i] = least(dp[i]!);
  return { dp: dpChoices, pp: pp.map(least), other: other.map(least) };
}

/**
 * Re-placement rounds SGLB gets between two changes of the flows: its switches re-place every
 * 10 ms and changes come seconds apart, so this only stops a routing that never settles.
 */
const SGLB_ROUNDS = 64;

/**
 * SGLB at flow level: each switch on the way steers the flow to one of the K members that
 * offer it the most when it is placed (see LinkLoads), which one drawn from the flow's hash,
 * since switches act on local, slightly stale signals rather than a global assignment. Every
 * 10 ms it re-places each flow whose member has left the K best for it (judged without the
 * flow itself), drawing again among them with a hash of its own, as the paper's authors'
 * simulator does; rounds repeat until one moves nothing, the routing the flows then run on.
 */
function sglb(dp: readonly OtherFlow[], pp: readonly OtherFlow[], other: readonly OtherFlow[], context: RoutingContext): PathChoice {
  const loads = new LinkLoads(context.fabric);
  const stamps = new Stamps(context.fabric);
  const k = Math.max(1, context.sglbK);
  const drawn = (best: number[], key: string, hop: number) => best[flowHash(hop === 0 ? key : `${key}#${hop}`, context.seed) % best.length]!;
  const flows = [...dp, ...pp, ...other];
  // When each flow last weighed its choices: one whose links no move has touched since would stay.
  const checked = new Float64Array(flows.length);
  const choices = flows.map((f, i) => {
    const placed = loads.place(f, k, (best, hop) => drawn(best, f.key, hop));
    checked[i] = stamps.touch(f);
    return placed;
  });
  for (let round = 0; round < SGLB_ROUNDS; round++) {
    let moved = false;
    flows.forEach((f, i) => {
      if (stamps.last(f) <= checked[i]!) return;
      const was = choices[i]!;
      loads.remove(f, was);
      const now = loads.place(f, k, (best, hop) => (best.includes(was[hop]!) ? was[hop]! : drawn(best, `${f.key}~remap`, hop)));
      choices[i] = now;
      if (now.every((c, hop) => c === was[hop])) {
        checked[i] = stamps.now;
        return;
      }
      moved = true;
      checked[i] = stamps.touch(f);
    });
    if (!moved) break;
  }
  return { dp: choices.slice(0, dp.length), pp: choices.slice(dp.length, dp.length + pp.length), other: choices.slice(dp.length + pp.length) };
}

/**
 * When the links a flow's choices weigh last changed, kept per rack (its uplinks, its
 * downlinks) and per pod (its core links, up and down), which are all a flow between two racks
 * can choose among: a flow none of whose were touched since it last chose would choose the same.
 */
class Stamps {
  #clock = 0;
  readonly #up: Float64Array;
  readonly #down: Float64Array;
  readonly #podUp: Float64Array;
  readonly #podDown: Float64Array;
  constructor(private readonly fabric: Fabric) {
    const racks = fabric.shape.racks;
    this.#up = new Float64Array(racks);
    this.#down = new Float64Array(racks);
    this.#podUp = new Float64Array(racks);
    this.#podDown = new Float64Array(racks);
  }
  get now(): number {
    return this.#clock;
  }
  /** Marks the links `f` can choose among as changed now, and returns now. */
  touch(f: OtherFlow): number {
    const t = ++this.#clock;
    this.#up[f.srcRack] = t;
    this.#down[f.dstRack] = t;
    if (this.#crossesCore(f)) {
      this.#podUp[this.fabric.podOf(f.srcRack)] = t;
      this.#podDown[this.fabric.podOf(f.dstRack)] = t;
    }
    return t;
  }
  /** When any link `f` can choose among last changed. */
  last(f: OtherFlow): number {
    const racks = Math.max(this.#up[f.srcRack]!, this.#down[f.dstRack]!);
    return this.#crossesCore(f) ? Math.max(racks, this.#podUp[this.fabric.podOf(f.srcRack)]!, this.#podDown[this.fabric.podOf(f.dstRack)]!) : racks;
  }
  #crossesCore(f: OtherFlow): boolean {
    return this.fabric.kind === "clos3" && this.fabric.podOf(f.srcRack) !== this.fabric.podOf(f.dstRack);
  }
}
