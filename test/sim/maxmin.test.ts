import * as highsModule from "highs";
import type { Highs } from "highs";
import { beforeAll, describe, expect, it } from "vitest";
import { maxMinRates, type MaxMinProblem } from "../../controller/simulator/maxmin.ts";
import { Random } from "../../controller/simulator/random.ts";

let highs: Highs;
beforeAll(async () => {
  highs = await (highsModule as unknown as { default: () => Promise<Highs> }).default();
});

/** How many times flow `f` crosses each link. */
function uses(problem: MaxMinProblem, f: number): Map<number, number> {
  const count = new Map<number, number>();
  for (const l of problem.flows[f]!) count.set(l, (count.get(l) ?? 0) + 1);
  return count;
}

/**
 * The lexicographic max-min allocation by linear programs alone, as an independent oracle:
 * raise the smallest rate of the unfrozen flows as far as the links allow, then freeze every
 * flow that cannot exceed that level while the others keep it, and repeat.
 */
function lexicographicMaxMin(problem: MaxMinProblem): number[] {
  const n = problem.flows.length;
  const fixed = new Array<number | undefined>(n).fill(undefined);
  const linkRows = (): string[] => {
    const rows: string[] = [];
    for (let l = 0; l < problem.capacities.length; l++) {
      const terms = problem.flows.flatMap((_, f) => {
        const k = uses(problem, f).get(l);
        return k ? [`${k} r${f}`] : [];
      });
      if (terms.length) rows.push(` c${l}: ${terms.join(" + ")} <= ${problem.capacities[l]}`);
    }
    return rows;
  };
  const fixedRows = () => fixed.flatMap((v, f) => (v === undefined ? [] : [` x${f}: r${f} = ${v}`]));
  const bound = (f: number) => {
    const demand = problem.demands?.[f] ?? Infinity;
    return demand === Infinity ? ` r${f} >= 0` : ` 0 <= r${f} <= ${demand}`;
  };
  const solve = (objective: string, extra: string[]): number => {
    const lp = [
      "Maximize",
      ` obj: ${objective}`,
      "Subject To",
      ...linkRows(),
      ...fixedRows(),
      ...extra,
      "Bounds",
      ...problem.flows.map((_, f) => bound(f)),
      " t >= 0",
      "End",
    ].join("\n");
    const result = highs.solve(lp);
    expect(result.Status).toBe("Optimal");
    return result.ObjectiveValue;
  };
  while (fixed.some((v) => v === undefined)) {
    const open = fixed.flatMap((v, f) => (v === undefined ? [f] : []));
    const level = solve(
      "t",
      open.map((f) => ` l${f}: r${f} - t >= 0`),
    );
    const atLevel = open.map((f) => ` m${f}: r${f} >= ${level}`);
    const stuck = open.filter((f) => solve(`r${f}`, atLevel) <= level * (1 + 1e-7) + 1e-9);
    expect(stuck.length).toBeGreaterThan(0);
    for (const f of stuck) fixed[f] = level;
  }
  return fixed as number[];
}

function randomProblem(random: Random): MaxMinProblem {
  const links = random.int(1, 6);
  const capacities = Array.from({ length: links }, () => random.int(1, 20));
  const flows = Array.from({ length: random.int(1, 7) }, () => {
    const path: number[] = [];
    for (let hop = random.int(1, 4); hop > 0; hop--) path.push(random.int(0, links - 1));
    return path;
  });
  // Some flows want less than any link could give them.
  const demands = flows.map(() => (random.float() < 0.3 ? random.uniform(0.5, 8) : Infinity));
  return { capacities, flows, demands };
}

describe("maxMinRates", () => {
  it("shares one link equally", () => {
    expect([...maxMinRates({ capacities: [12], flows: [[0], [0], [0]] })]).toEqual([4, 4, 4]);
  });

  it("gives what a bottlenecked flow leaves to the others (the classic parking lot)", () => {
    // Link 0 (cap 10) carries flows 0 and 1; link 1 (cap 4) carries flows 1 and 2.
    const rates = maxMinRates({ capacities: [10, 4], flows: [[0], [0, 1], [1]] });
    expect([...rates]).toEqual([8, 2, 2]);
  });

  it("charges a flow once per crossing, as a ring with two hops through one uplink", () => {
    const rates = maxMinRates({ capacities: [6, 100], flows: [[0, 0, 1], [0]] });
    expect(rates[0]).toBeCloseTo(2, 12);
    expect(rates[1]).toBeCloseTo(2, 12);
  });

  it("stops a flow at its demand and gives the rest to the others", () => {
    expect([...maxMinRates({ capacities: [12], flows: [[0], [0], [0]], demands: [1, Infinity, 2] })]).toEqual([1, 9, 2]);
    expect([...maxMinRates({ capacities: [12], flows: [[0], []], demands: [Infinity, 3] })]).toEqual([12, 3]);
  });

  it("refuses a flow with no link and a link with no capacity", () => {
    expect(() => maxMinRates({ capacities: [1], flows: [[]] })).toThrow(/crosses no link/);
    expect(() => maxMinRates({ capacities: [1], flows: [[3]] })).toThrow(/no capacity/);
  });

  it("matches lexicographic max-min by linear programming on 150 random networks", () => {
    const random = new Random(7);
    for (let n = 0; n < 150; n++) {
      const problem = randomProblem(random);
      const ours = maxMinRates(problem);
      const oracle = lexicographicMaxMin(problem);
      oracle.forEach((rate, f) => expect(ours[f]).toBeCloseTo(rate, 6));
    }
  });

  it("leaves every flow its demand or a bottleneck: a full link on which no flow gets more", () => {
    const random = new Random(11);
    for (let n = 0; n < 300; n++) {
      const problem = randomProblem(random);
      const rates = maxMinRates(problem);
      const load = new Float64Array(problem.capacities.length);
      problem.flows.forEach((links, f) => links.forEach((l) => (load[l]! += rates[f]!)));
      load.forEach((used, l) => expect(used).toBeLessThanOrEqual(problem.capacities[l]! * (1 + 1e-9)));
      problem.flows.forEach((links, f) => {
        const demand = problem.demands?.[f] ?? Infinity;
        expect(rates[f]).toBeLessThanOrEqual(demand * (1 + 1e-9));
        if (rates[f]! >= demand * (1 - 1e-9)) return;
        const bottleneck = links.some(
          (l) =>
            load[l]! >= problem.capacities[l]! * (1 - 1e-9) && problem.flows.every((other, g) => !other.includes(l) || rates[g]! <= rates[f]! * (1 + 1e-9)),
        );
        expect(bottleneck).toBe(true);
      });
    }
  });
});
