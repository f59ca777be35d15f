/**
 * Exact max-min fair rates by progressive filling (Bertsekas & Gallager, §6.5.2): every flow
 * not yet frozen grows at the same pace; when a link fills, the flows crossing it freeze at
 * the level reached. The result is the unique allocation in which every flow crosses some
 * full link on which no other flow gets more: its bottleneck.
 *
 * A flow lists the links it crosses; a link listed k times carries k times the flow's rate.
 * That is how a ring collective is one flow: all of its hops advance in lockstep, so it
 * moves at the pace of its slowest hop, and two hops through one uplink load it twice.
 *
 * A flow may have a demand: the most it wants, as a pipeline transfer that only has to keep
 * pace with computation. It freezes there as if it had a link of its own of that capacity.
 *
 * Cost grows with the distinct rate levels times the links in use, not with the cluster:
 * links no flow crosses are never looked at.
 */
export interface MaxMinProblem {
  /** Capacity of every link, in any unit of rate. */
  readonly capacities: ArrayLike<number>;
  /** The links each flow crosses, repeated where it crosses one several times. */
  readonly flows: readonly (readonly number[])[];
  /** Most each flow wants; `Infinity` (or none given) for as much as the links allow. */
  readonly demands?: ArrayLike<number>;
}

/** Relative slack under which a link counts as full, for sums of floating-point shares. */
const FULL = 1e-9;

export function maxMinRates({ capacities, flows, demands }: MaxMinProblem): Float64Array {
  const rates = new Float64Array(flows.length);
  // Links in use get dense indices; each flow keeps its distinct links with multiplicities, so
  // a flow listing a link thousands of times (an all-to-all) costs one entry per link.
  const dense = new Map<number, number>();
  const capacity: number[] = [];
  const usersOf: number[][] = [];
  const linksOf: number[][] = [];
  const countsOf: number[][] = [];
  // Per dense link: the last flow that listed it, and where in that flow's list it sits.
  const lastFlow: number[] = [];
  const slot: number[] = [];
  flows.forEach((links, f) => {
    const demand = demands?.[f] ?? Infinity;
    if (!(demand >= 0)) throw new RangeError(`flow ${f} has demand ${demand}; demands are rates, at least 0`);
    if (links.length === 0 && demand === Infinity) throw new RangeError(`flow ${f} crosses no link and has no demand, so its max-min rate is unbounded`);
    const distinct: number[] = [];
    const counts: number[] = [];
    for (const link of links) {
      let d = dense.get(link);
      if (d === undefined) {
        const c = capacities[link];
        if (c === undefined || !(c >= 0)) throw new RangeError(`flow ${f} crosses link ${link}, which has no capacity`);
        d = capacity.length;
        dense.set(link, d);
        capacity.push(c);
        usersOf.push([]);
        lastFlow.push(-1);
        slot.push(0);
      }
      if (lastFlow[d] === f) {
        counts[slot[d]!]!++;
      } else {
        lastFlow[d] = f;
        slot[d] = distinct.length;
        distinct.push(d);
        counts.push(1);
        usersOf[d]!.push(f);
      }
    }
    linksOf.push(distinct);
    countsOf.push(counts);
  });
  const weight = new Float64Array(capacity.length);
  linksOf.forEach((links, f) => links.forEach((d, i) => (weight[d]! += countsOf[f]![i]!)));
  const remaining = Float64Array.from(capacity);
  const frozen = new Uint8Array(flows.length);
  let unfrozen = flows.length;
  let level = 0;
  // Flows with a finite demand, smallest first: each freezes when the level reaches it.
  const capped = flows.map((_, f) => f).filter((f) => (demands?.[f] ?? Infinity) < Infinity);
  capped.sort((a, b) => demands![a]! - demands![b]!);
  let nextCapped = 0;
  const freeze = (f: number) => {
    frozen[f] = 1;
    unfrozen--;
    rates[f] = level;
    linksOf[f]!.forEach((d, i) => (weight[d]! -= countsOf[f]![i]!));
  };
  while (unfrozen > 0) {
    while (nextCapped < capped.length && frozen[capped[nextCapped]!]) nextCapped++;
    let step = nextCapped < capped.length ? demands![capped[nextCapped]!]! - level : Infinity;
    for (let d = 0; d < weight.length; d++) if (weight[d]! > 0) step = Math.min(step, remaining[d]! / weight[d]!);
    level += step;
    const full: number[] = [];
    for (let d = 0; d < weight.length; d++) {
      if (weight[d] === 0) continue;
      remaining[d]! -= step * weight[d]!;
      if (remaining[d]! <= FULL * capacity[d]!) full.push(d);
    }
    for (; nextCapped < capped.length && demands![capped[nextCapped]!]! <= level * (1 + FULL); nextCapped++) {
      if (!frozen[capped[nextCapped]!]) freeze(capped[nextCapped]!);
    }
    for (const d of full) for (const f of usersOf[d]!) if (!frozen[f]) freeze(f);
  }
  return rates;
}
